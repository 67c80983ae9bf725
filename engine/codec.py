"""Dataclass <-> JSON-compatible dict, driven by type hints.

Pure and generic so every event round-trips through the log without a
hand-written serializer per type; the log adds the envelope around it.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
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
    return typing.cast(T, _builder(cls)(data))


Builder = Callable[[Any], Any]
# One builder per type, made once from its hints: replaying a log decodes every
# event, so walking the type hints again for each one would dominate replay time.
_BUILDERS: dict[Any, Builder] = {}


def _same(data: Any) -> Any:
    return data


def _builder(tp: Any) -> Builder:
    found = _BUILDERS.get(tp)
    if found is None:
        # A type that refers to itself finds this stand-in until its builder is made.
        _BUILDERS[tp] = lambda data: _builder(tp)(data)
        found = _BUILDERS[tp] = _make_builder(tp)
    return found


def _make_builder(tp: Any) -> Builder:
    origin = get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        option = _builder(next(a for a in get_args(tp) if a is not type(None)))
        return lambda data: None if data is None else option(data)
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            item = _builder(args[0])
            if item is _same:
                return tuple
            return lambda data: tuple([item(v) for v in data])
        items = [_builder(a) for a in args]
        return lambda data: tuple(b(v) for b, v in zip(items, data, strict=True))
    if origin is dict:
        value = _builder(get_args(tp)[1])
        return lambda data: {k: value(v) for k, v in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_builder(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    if tp is float:
        return lambda data: float(data) if isinstance(data, int) else data
    return _same


def _dataclass_builder(cls: type) -> Builder:
    """A function made for `cls` alone, from generated source.

    A replay builds a few dataclasses per event, and a loop over the fields with
    a kwargs dict was most of it. The function sets each field straight on a new
    instance, as a frozen dataclass's own __init__ does (object.__setattr__), but
    without the call through keywords; a class whose __init__ does more (a
    __post_init__, fields outside __init__) is called the ordinary way.
    """
    hints = _hints(cls)
    fields = dataclasses.fields(cls)
    direct = not hasattr(cls, "__post_init__") and all(f.init for f in fields)
    names: dict[str, Any] = {"cls": cls, "new": object.__new__, "put": object.__setattr__}
    values = []
    for index, field in enumerate(fields):
        key = repr(field.name)
        build = _builder(hints[field.name])
        value = f"data[{key}]"
        if build is not _same:
            names[f"b{index}"] = build
            value = f"b{index}({value})"
        if field.default is not dataclasses.MISSING:
            names[f"d{index}"] = field.default
            value = f"({value} if {key} in data else d{index})"
        elif field.default_factory is not dataclasses.MISSING:
            names[f"f{index}"] = field.default_factory
            value = f"({value} if {key} in data else f{index}())"
        values.append((field.name, key, value))
    if direct:
        body = ["    o = new(cls)"]
        body += [f"    put(o, {key}, {value})" for _, key, value in values]
        body.append("    return o")
    else:
        body = [f"    return cls({', '.join(f'{name}={value}' for name, _, value in values)})"]
    source = "def build(data):\n" + "\n".join(body) + "\n"
    exec(compile(source, f"<decoder of {cls.__qualname__}>", "exec"), names)
    return typing.cast(Builder, names["build"])
