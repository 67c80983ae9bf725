"""The stored form of an event: the envelope every backend writes and reads.

The hash chain is computed here, once, so SQLite and Kafka logs are byte-for-byte
comparable and `audit verify` means the same thing on both.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson

GENESIS_HASH = "0" * 64


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event ready to append: everything but its position, time and hashes."""

    id: str
    type: str
    schema_version: int
    data: dict[str, Any]
    actor: str
    cause: str


class StoredEvent(NamedTuple):
    """An event as the log holds it. `seq` starts at 1 and has no gaps.

    A NamedTuple rather than a frozen dataclass: immutable all the same, and built
    about four times faster, which every replay and projection rebuild feels.
    """

    seq: int
    id: str
    type: str
    schema_version: int
    data: dict[str, Any]
    time: str
    actor: str
    cause: str
    prev_hash: str
    hash: str

    def to_record(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "id": self.id,
            "type": self.type,
            "schema_version": self.schema_version,
            "data": self.data,
            "time": self.time,
            "actor": self.actor,
            "cause": self.cause,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }

    @staticmethod
    def from_record(record: dict[str, Any]) -> StoredEvent:
        """The event a decoded record holds; TypeError or KeyError if it holds none.

        Every replayed record comes through here, so the fields are taken in one
        C-level call and their types checked as one tuple: no value is converted.
        """
        values = _RECORD_FIELDS(record)
        if tuple(map(type, values)) != _RECORD_TYPES:
            wrong = [
                f"{name} is a {type(value).__name__}, not {expected.__name__}"
                for name, value, expected in zip(
                    StoredEvent._fields, values, _RECORD_TYPES, strict=True
                )
                if type(value) is not expected
            ]
            raise TypeError("; ".join(wrong))
        return tuple.__new__(StoredEvent, values)


_RECORD_FIELDS = operator.itemgetter(*StoredEvent._fields)
_RECORD_TYPES = (int, str, str, int, dict, str, str, str, str, str)


# orjson writes every value as the standard library's json does, with one exception:
# floats under 1e-4 in magnitude (`0.00001` and `2.5e-7` against `1e-05` and
# `2.5e-07`). `_small_float` finds both of orjson's spellings of such a number.
_TOKEN_START = frozenset(b":,[-")
_DIGITS = frozenset(b"0123456789")


def _small_float(encoded: bytes) -> bool:
    """Whether orjson's output may hold a float the standard library spells otherwise.

    Text that merely looks like one only costs the slow path. Plain `bytes.find`
    is used rather than a regular expression: timestamps put `.0000` in most
    events, and this runs on every one.
    """
    at = encoded.find(b"e-")
    while at != -1:
        if at > 0 and encoded[at - 1] in _DIGITS:
            return True
        at = encoded.find(b"e-", at + 2)
    at = encoded.find(b"0.0000")
    while at != -1:
        if at == 0 or encoded[at - 1] in _TOKEN_START:
            return True
        at = encoded.find(b"0.0000", at + 6)
    return False


def canonical_json(value: Any) -> bytes:
    """One encoding for hashing and storage: sorted keys, no spaces, UTF-8.

    The standard library's `json.dumps(sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)` defines it; orjson produces the same bytes about ten
    times faster, and hands back to json whatever it would spell otherwise
    (small floats, integers over 64 bits, non-string keys).
    """
    try:
        encoded = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return _json_canonical(value)
    if _small_float(encoded):
        return _json_canonical(value)
    return encoded


def _json_canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def format_time(moment: datetime) -> str:
    """UTC, microseconds, `Z` suffix: sorts as text and parses back exactly."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def hashed_body(
    *,
    seq: int,
    id: str,
    type: str,
    schema_version: int,
    data: dict[str, Any],
    time: str,
    actor: str,
    cause: str,
    prev_hash: str,
) -> bytes:
    """The bytes an event's hash is computed over: its record less the `hash` member."""
    return canonical_json(
        {
            "seq": seq,
            "id": id,
            "type": type,
            "schema_version": schema_version,
            "data": data,
            "time": time,
            "actor": actor,
            "cause": cause,
            "prev_hash": prev_hash,
        }
    )


def event_hash(event: StoredEvent) -> str:
    """The hash `event` must carry: SHA-256 over its record less the `hash` member."""
    body = hashed_body(
        seq=event.seq,
        id=event.id,
        type=event.type,
        schema_version=event.schema_version,
        data=event.data,
        time=event.time,
        actor=event.actor,
        cause=event.cause,
        prev_hash=event.prev_hash,
    )
    return hashlib.sha256(body).hexdigest()


def seal_record(
    event: NewEvent, *, seq: int, time: str, prev_hash: str
) -> tuple[StoredEvent, bytes]:
    """Give a new event its place in the chain, with its record's canonical bytes.

    The record is the hashed body plus its `hash` member, which sorts just before
    `id`, the last `,"id":` in the body (only scalars follow it): the body is
    encoded once, for the hash and the record both.
    """
    body = hashed_body(
        seq=seq,
        id=event.id,
        type=event.type,
        schema_version=event.schema_version,
        data=event.data,
        time=time,
        actor=event.actor,
        cause=event.cause,
        prev_hash=prev_hash,
    )
    digest = hashlib.sha256(body).hexdigest()
    at = body.rfind(b',"id":')
    record = b"".join((body[:at], b',"hash":"', digest.encode("ascii"), b'"', body[at:]))
    stored = StoredEvent(
        seq=seq,
        id=event.id,
        type=event.type,
        schema_version=event.schema_version,
        data=event.data,
        time=time,
        actor=event.actor,
        cause=event.cause,
        prev_hash=prev_hash,
        hash=digest,
    )
    return stored, record


def seal(event: NewEvent, *, seq: int, time: str, prev_hash: str) -> StoredEvent:
    """Give a new event its place in the chain."""
    return seal_record(event, seq=seq, time=time, prev_hash=prev_hash)[0]


def seal_batch_records(
    events: Sequence[NewEvent], *, first_seq: int, time: str, prev_hash: str
) -> list[tuple[StoredEvent, bytes]]:
    """Seal `events` in order, each linked to the one before, with their records' bytes."""
    sealed: list[tuple[StoredEvent, bytes]] = []
    for offset, event in enumerate(events):
        stored, record = seal_record(event, seq=first_seq + offset, time=time, prev_hash=prev_hash)
        sealed.append((stored, record))
        prev_hash = stored.hash
    return sealed


def seal_batch(
    events: Sequence[NewEvent], *, first_seq: int, time: str, prev_hash: str
) -> list[StoredEvent]:
    return [
        stored
        for stored, _ in seal_batch_records(
            events, first_seq=first_seq, time=time, prev_hash=prev_hash
        )
    ]


@dataclass(frozen=True, slots=True)
class ChainBreak:
    seq: int
    reason: str


class ChainChecker:
    """Checks stored events one at a time, in order: seq continuity, links and content.

    `recompute=False` checks only the links (seq, prev_hash), for events whose
    content the caller has already checked against their hash (record_hash_holds).
    """

    def __init__(
        self, *, expect_first_seq: int = 1, prev_hash: str = GENESIS_HASH, recompute: bool = True
    ) -> None:
        self.expected = expect_first_seq
        self.prev_hash = prev_hash
        self.recompute = recompute

    def check(self, event: StoredEvent) -> ChainBreak | None:
        if event.seq != self.expected:
            return ChainBreak(
                self.expected,
                f"expected seq {self.expected}, found {event.seq}: events are missing or out of order",
            )
        if event.prev_hash != self.prev_hash:
            return ChainBreak(event.seq, "prev_hash does not match the hash of the event before it")
        if self.recompute:
            recomputed = event_hash(event)
            if recomputed != event.hash:
                return ChainBreak(
                    event.seq, "content does not match its hash: the event was changed"
                )
        self.prev_hash = event.hash
        self.expected += 1
        return None


def verify_chain(
    events: Any, *, expect_first_seq: int = 1, prev_hash: str = GENESIS_HASH, recompute: bool = True
) -> ChainBreak | None:
    """Walk stored events in order; return the first break, or None if the chain holds."""
    checker = ChainChecker(
        expect_first_seq=expect_first_seq, prev_hash=prev_hash, recompute=recompute
    )
    for event in events:
        broken = checker.check(event)
        if broken is not None:
            return broken
    return None


def stored_hash_holds(event: StoredEvent, data_json: bytes) -> bool:
    """Whether `event` hashes to its `hash`, its data taken as `data_json`: the bytes
    `canonical_json(data)` gave when it was stored (SQLite keeps them as they are).

    Only the envelope's few scalars are encoded (orjson writes them as the standard
    library does: no floats among them), and the data's bytes are hashed in place,
    which spares re-encoding the payload. False when they are not the canonical
    bytes: the caller then recomputes the hash the long way.
    """
    head = orjson.dumps(
        {  # in sorted order, as canonical JSON has it; 0 holds the data's place
            "actor": event.actor,
            "cause": event.cause,
            "data": 0,
            "id": event.id,
            "prev_hash": event.prev_hash,
            "schema_version": event.schema_version,
            "seq": event.seq,
            "time": event.time,
            "type": event.type,
        }
    )
    at = head.find(b',"data":0,"id":') + 8  # no string holds an unescaped quote
    body = hashlib.sha256(head[:at])
    body.update(data_json)
    body.update(head[at + 1 :])
    return body.hexdigest() == event.hash


def record_hash_holds(raw: bytes, digest: str) -> bool:
    """Whether `raw`, an event stored as `canonical_json(to_record())`, hashes to `digest`.

    The hashed body is the record without its `hash` member, and canonical JSON
    sorts keys, so the body's bytes are the record's bytes less `,"hash":"<digest>"`:
    hashing them checks the content without decoding and re-encoding it. The
    member is the last of its kind: only scalars follow it (`id` to `type`), where
    a quote is always escaped. False when it is missing (bytes that are not
    canonical): the caller then recomputes the hash the long way.
    """
    member = b',"hash":"' + digest.encode("ascii", "replace") + b'"'
    at = raw.rfind(member)
    if at < 0:
        return False
    body = hashlib.sha256(raw[:at])
    body.update(raw[at + len(member) :])
    return body.hexdigest() == digest
