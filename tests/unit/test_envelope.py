"""The canonical encoding that every event hash is computed over."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.envelope import canonical_json


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
