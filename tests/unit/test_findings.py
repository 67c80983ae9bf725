"""A spec's problem is one type, `findings.Finding`: schemas finds it, policies and the
reconciler add to it, and CommitRejected records it as it is (issue #13). What still needs
guarding: that the log keeps every finding exactly, located as the author saw it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gitsched.engine import events as ev
from gitsched.engine.codec import from_data, to_data
from gitsched.engine.core import RejectCommit, decide
from gitsched.engine.state import ClusterState, fold
from gitsched.findings import Finding
from gitsched.schemas import parse_documents
from tests.support.factories import commit

findings_ = st.builds(
    Finding,
    file=st.text(min_size=1, max_size=20),
    line=st.one_of(st.none(), st.integers(1, 10_000)),
    column=st.one_of(st.none(), st.integers(1, 200)),
    path=st.text(max_size=20),
    message=st.text(max_size=40),
    code=st.text(min_size=1, max_size=20),
)


@given(st.lists(findings_, min_size=1, max_size=4))
def test_a_rejected_commit_keeps_every_finding_through_the_log(found: list[Finding]) -> None:
    (rejected,) = decide(ClusterState(), RejectCommit(commit(1), tuple(found)))
    assert isinstance(rejected, ev.CommitRejected)
    stored = from_data(ev.CommitRejected, to_data(rejected))
    assert stored.errors == tuple(found)
    assert [f.format() for f in stored.errors] == [f.format() for f in found]
    assert fold([stored], ClusterState()).last_rejection == tuple(found)


def test_what_schemas_finds_is_what_the_rejection_records() -> None:
    _, found = parse_documents(b"kind: Job\nspec: [unclosed\n", "teams/q/jobs/a.yaml")
    assert found and all(type(f) is Finding for f in found)
    (rejected,) = decide(ClusterState(), RejectCommit(commit(1), found))
    assert isinstance(rejected, ev.CommitRejected)
    assert rejected.errors == found
    assert rejected.errors[0].format().startswith("teams/q/jobs/a.yaml:")
