"""Dataclass <-> JSON-compatible dict, driven by type hints.

Pure and generic so every event round-trips through the log without a
hand-written serializer per type; the log adds the envelope around it.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import cache
from typing import Any, TypeVar, get_args, get_origin

T = TypeVar("T")


def to_data(value: Any) -> Any:
    """A JSON-compatible copy of `value` (dataclasses become dicts, tuples lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_data(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_data(v) for k, v in value.items()}
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_data(cls: type[T], data: Any) -> T:
    """Rebuild a dataclass of type `cls` from `to_data`'s output; missing fields take defaults."""
    return typing.cast(T, _build(cls, data))


def _build(tp: Any, data: Any) -> Any:
    origin = get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        if data is None:
            return None
        options = [a for a in get_args(tp) if a is not type(None)]
        return _build(options[0], data)
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in data)
        return tuple(_build(a, v) for a, v in zip(args, data, strict=True))
    if origin is dict:
        _, value_type = get_args(tp)
        return {k: _build(value_type, v) for k, v in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        kwargs = {
            f.name: _build(hints[f.name], data[f.name])
            for f in dataclasses.fields(tp)
            if f.name in data
        }
        return tp(**kwargs)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    if tp is float and isinstance(data, int):
        return float(data)
    return data
