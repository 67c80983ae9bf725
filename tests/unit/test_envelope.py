"""The canonical encoding that every event hash is computed over."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitsched.eventlog.envelope import (
    GENESIS_HASH,
    NewEvent,
    StoredEvent,
    canonical_json,
    record_hash_holds,
    seal,
    seal_batch_records,
)


def reference(value: Any) -> bytes:
    """The definition: the standard library's sorted, compact, UTF-8 JSON."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=1000)
@given(json_values)
def test_canonical_json_is_byte_for_byte_the_standard_librarys(value: Any) -> None:
    assert canonical_json(value) == reference(value)


def test_small_floats_keep_python_spelling_even_beside_look_alike_text() -> None:
    for number in (1e-05, 2.5e-07, 0.00001234, -3e-300, 5e-324, 1e-4, 1e16, 0.1):
        value = {"gap": number, "node": "node-0e-5", "note": "0.0000 in text"}
        assert canonical_json(value) == reference(value)
        assert canonical_json(number) == reference(number)
        assert canonical_json([number, -number]) == reference([number, -number])
    assert canonical_json({"gap": 1e-05}) == b'{"gap":1e-05}'


# Payloads that try to confuse the byte-level hash check: keys named like the
# envelope's, the member itself quoted in text, nested objects ending in `hash`.
payloads = st.dictionaries(
    st.sampled_from(["hash", "id", "seq", "x", "prev_hash", "data"]) | st.text(max_size=6),
    json_values | st.just(',"hash":"') | st.just({"hash": "0" * 64}),
    max_size=4,
)


@settings(max_examples=500)
@given(payloads, st.text(max_size=8))
def test_a_stored_record_passes_the_byte_level_hash_check_and_nothing_else_does(
    data: dict[str, Any], actor: str
) -> None:
    event = seal(
        NewEvent(
            id="e-1", type="JobSubmitted", schema_version=1, data=data, actor=actor, cause="c"
        ),
        seq=7,
        time="2026-11-22T00:00:00.000000Z",
        prev_hash=GENESIS_HASH,
    )
    raw = canonical_json(event.to_record())
    assert record_hash_holds(raw, event.hash)
    assert StoredEvent.from_record(json.loads(raw)) == event
    # The payload echoing the member (even with this very digest) changes the content.
    echoed = canonical_json(dict(event.to_record(), data={**data, "hash": event.hash}))
    assert not record_hash_holds(echoed, event.hash)
    assert not record_hash_holds(raw.replace(b'"seq":7', b'"seq":8'), event.hash)
    assert not record_hash_holds(raw, "f" * 64)


def test_a_record_with_a_field_of_the_wrong_type_is_refused_by_name() -> None:
    event = seal(
        NewEvent(id="e-1", type="JobSubmitted", schema_version=1, data={}, actor="a", cause="c"),
        seq=1,
        time="2026-11-22T00:00:00.000000Z",
        prev_hash=GENESIS_HASH,
    )
    with pytest.raises(TypeError, match="seq is a str, not int"):
        StoredEvent.from_record(dict(event.to_record(), seq="1"))
    with pytest.raises(TypeError, match="schema_version is a bool, not int"):
        StoredEvent.from_record(dict(event.to_record(), schema_version=True))
    with pytest.raises(TypeError, match="data is a list, not dict; actor is a int, not str"):
        StoredEvent.from_record(dict(event.to_record(), data=[], actor=5))
    with pytest.raises(KeyError):
        StoredEvent.from_record({k: v for k, v in event.to_record().items() if k != "cause"})


@settings(max_examples=300)
@given(st.lists(payloads, min_size=1, max_size=4), st.text(max_size=8))
def test_sealed_records_are_the_canonical_records_of_the_sealed_events(
    datas: list[dict[str, Any]], cause: str
) -> None:
    new = [
        NewEvent(id=f"e-{n}", type="T", schema_version=1, data=d, actor="a", cause=cause)
        for n, d in enumerate(datas)
    ]
    sealed = seal_batch_records(
        new, first_seq=3, time="2026-11-22T00:00:00.000000Z", prev_hash=GENESIS_HASH
    )
    for event, record in sealed:
        assert record == canonical_json(event.to_record())
        assert record_hash_holds(record, event.hash)
