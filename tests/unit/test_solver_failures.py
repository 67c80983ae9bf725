"""What a failed MILP solve becomes (engine.placement.solvers, issue #13): a solver
library's failure is answered with greedy's plan and the solve event says why; a bug in our
own formulation propagates, so it is never hidden behind a plan that looks merely greedy."""

from __future__ import annotations

from typing import Any

import pytest

from gitsched.engine import events as ev
from gitsched.engine.core import ApplyPlan, decide
from gitsched.engine.model import Policy
from gitsched.engine.placement import linear, milp, solvers
from gitsched.engine.placement.plan import OutcomeStatus
from gitsched.engine.state import ClusterState
from tests.support.factories import instance, job, node, queue


def _instance(solver: str) -> Any:
    return instance(
        [node("n1"), node("n2")],
        [queue("q")],
        [job("a", gpu=4), job("b", gpu=2)],
        policy=Policy(solver=solver),
    )


def _formulation_bug(*args: object, **kwargs: object) -> None:
    raise KeyError("q/a")  # what a lookup mistake in our own model building raises


@pytest.mark.parametrize("solver", ["highs", "cbc", "cpsat"])
def test_a_bug_in_our_formulation_propagates_from_a_full_solve(
    monkeypatch: pytest.MonkeyPatch, solver: str
) -> None:
    monkeypatch.setattr(milp, "build", _formulation_bug)
    with pytest.raises(KeyError, match="q/a"):
        solvers.solve(_instance(solver))


def test_a_bug_in_our_formulation_propagates_from_an_incremental_solve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(milp, "build", _formulation_bug)
    with pytest.raises(KeyError, match="q/a"):
        solvers.solve_changed(_instance("highs"), ["q/a"])


def _crashing_highs(highspy: Any) -> Any:
    """The real HiGHS class, whose run fails as pybind11 reports a C++ exception."""
    core = getattr(highspy, "_core", None)
    base = getattr(core, "_Highs", None) or highspy.Highs

    class Crashing(base):  # type: ignore[misc, valid-type]
        def run(self) -> Any:
            raise RuntimeError("HiGHS: internal error in the MIP solver")

    h = Crashing()
    h.setOptionValue("output_flag", False)
    return h


def test_a_failure_inside_the_solver_library_falls_back_and_the_solve_event_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(linear, "_new_highs", _crashing_highs)
    inst = _instance("highs")
    plan = solvers.solve(inst)
    assert plan.outcome("q/a").status is OutcomeStatus.PLACED
    assert plan.outcome("q/b").status is OutcomeStatus.PLACED
    events = decide(ClusterState(), ApplyPlan(plan, solve_id="s", at=inst.now))
    (done,) = [e for e in events if isinstance(e, ev.SolveCompleted)]
    assert (done.solver, done.plan_source) == ("highs", "greedy")
    assert done.fallback == (
        "the highs solver failed: SolverFailed: HiGHS failed: "
        "HiGHS: internal error in the MIP solver"
    )
    # The incremental path answers the same way.
    changed = solvers.solve_changed(inst, ["q/a"])
    assert changed is not None and changed.stats.fallback == plan.stats.fallback


def test_running_out_of_memory_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(*args: object) -> None:
        raise MemoryError()

    monkeypatch.setattr(linear, "_solve_cbc", out_of_memory)
    plan = solvers.solve(_instance("cbc"))
    assert plan.outcome("q/a").status is OutcomeStatus.PLACED
    assert plan.stats.fallback == "the cbc solver failed: MemoryError: "
