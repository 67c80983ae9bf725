"""Dataclass <-> JSON-compatible dict, driven by type hints.

Pure and generic so every event round-trips through the log without a
hand-written serializer per type; the log adds the envelope around it.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def to_data(value: Any) -> Any:
    """A JSON-compatible copy of `value` (dataclasses become dicts, tuples lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A field the constructor does not take is derived from the others (Job.key): not data.
        return {
            f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_data(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_data(v) for k, v in value.items()}
    return value


def from_data(cls: type[T], data: Any) -> T:
    """Rebuild a value of type `cls` from `to_data`'s output; missing fields take defaults.

    msgspec walks the type hints once per type and builds in C, checking every
    value's type on the way: a replay decodes every event, and this is about
    twice as fast as the best generated Python. A value of the wrong shape
    raises `msgspec.ValidationError`, a ValueError naming the path to it.
    """
    return msgspec.convert(data, cls)
