"""The folded cluster state as bytes, and back.

A snapshot lets a reader start from the state after event N instead of replaying
the log from its first event. It is a cache, never the truth: the encoding follows
`ClusterState`'s own fields and types, and `STATE_FORMAT` (a digest of their schema)
changes with any change to them, so a snapshot written by another version of the
state is never decoded into this one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import typing
from typing import Any

import msgspec
from immutables import Map

from gitsched.engine.errors import PermanentError
from gitsched.engine.state import ClusterState


def _map_fields() -> tuple[tuple[str, Any], ...]:
    """(name, type) of every ClusterState field, persistent maps spelled as plain dicts."""
    hints = typing.get_type_hints(ClusterState)
    fields: list[tuple[str, Any]] = []
    for f in dataclasses.fields(ClusterState):
        hint = hints[f.name]
        if typing.get_origin(hint) is Map:
            key, value = typing.get_args(hint)
            hint = dict[key, value]  # type: ignore[valid-type]
        fields.append((f.name, hint))
    return tuple(fields)


_FIELDS = _map_fields()
_MAPS = frozenset(name for name, hint in _FIELDS if typing.get_origin(hint) is dict)
_Shape = msgspec.defstruct("ClusterStateSnapshot", list(_FIELDS), frozen=True)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Shape)


# Changes whenever a field of the state, or of anything it holds, changes name or type.
def _any_schema(kind: type) -> dict[str, Any]:
    """Free-form values (`object`, e.g. a Job's pod template) take any JSON value."""
    if kind is object:
        return {"title": "any"}
    raise NotImplementedError(kind)


STATE_FORMAT = hashlib.sha256(
    msgspec.json.encode(msgspec.json.schema(_Shape, schema_hook=_any_schema))
).hexdigest()[:16]


class SnapshotDecodeError(PermanentError, ValueError):
    """The bytes are not a snapshot of this state format."""


def encode_state(state: ClusterState) -> bytes:
    """`state` as MessagePack, in the shape of STATE_FORMAT."""
    values = {
        name: dict(getattr(state, name).items()) if name in _MAPS else getattr(state, name)
        for name, _ in _FIELDS
    }
    return _encoder.encode(_Shape(**values))


def decode_state(body: bytes) -> ClusterState:
    """The state `encode_state` wrote; SnapshotDecodeError when the bytes do not fit."""
    try:
        shape = _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise SnapshotDecodeError(str(e)) from e
    values: dict[str, Any] = {
        name: Map(getattr(shape, name)) if name in _MAPS else getattr(shape, name)
        for name, _ in _FIELDS
    }
    return ClusterState(**values)
