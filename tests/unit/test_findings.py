"""A spec's problem is one thing with two names: `schemas.SpecError` (schemas imports
nothing of ours) and `engine.model.Finding` (what CommitRejected records; the engine
imports nothing of ours). The reconciler turns one into the other in one place; these
tests keep the two from drifting apart."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from engine.model import Finding
from reconciler.specs import to_finding
from schemas import SpecError


def test_the_two_have_the_same_fields_in_the_same_order() -> None:
    spec = [(f.name, str(f.type)) for f in dataclasses.fields(SpecError)]
    finding = [(f.name, str(f.type)) for f in dataclasses.fields(Finding)]
    assert spec == finding


@given(
    file=st.text(min_size=1, max_size=20),
    line=st.one_of(st.none(), st.integers(1, 10_000)),
    column=st.one_of(st.none(), st.integers(1, 200)),
    path=st.text(max_size=20),
    message=st.text(max_size=40),
    code=st.text(min_size=1, max_size=20),
)
def test_a_finding_reads_as_the_spec_error_it_records(
    file: str, line: int | None, column: int | None, path: str, message: str, code: str
) -> None:
    error = SpecError(file, line, column, path, message, code)
    finding = to_finding(error)
    assert dataclasses.astuple(finding) == dataclasses.astuple(error)
    assert finding.format() == error.format()
