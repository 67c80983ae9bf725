"""A solver-neutral mixed-integer linear model, and the three backends that solve it.

The placement model is built once, as plain rows and columns with names, and
handed to HiGHS (through highspy), CBC (through PuLP) or OR-Tools CP-SAT (integer
rows: `_solve_cpsat` scales them, docs/solver.md). No library is typed; everything
untyped stays inside `_solve_highs`, `_solve_cbc` and `_solve_cpsat`. What the libraries
raise when they fail is wrapped here, where they are called, as `SolverFailed`; a solve
that ends without a plan is a status ("error", "infeasible"), not an exception.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gitsched.engine.errors import SolverFailed

INF = math.inf
# The engines `solve` knows. CP-SAT solves integer programs only: `_solve_cpsat` scales.
BACKENDS = ("highs", "cbc", "cpsat")


@dataclass(slots=True)
class LinearModel:
    """max c·x subject to lo <= A x <= hi and bounds; integer columns where flagged."""

    col_names: list[str] = field(default_factory=list)
    col_lower: list[float] = field(default_factory=list)
    col_upper: list[float] = field(default_factory=list)
    col_cost: list[float] = field(default_factory=list)
    col_integer: list[bool] = field(default_factory=list)
    row_names: list[str] = field(default_factory=list)
    row_lower: list[float] = field(default_factory=list)
    row_upper: list[float] = field(default_factory=list)
    row_index: list[list[int]] = field(default_factory=list)
    row_value: list[list[float]] = field(default_factory=list)
    offset: float = 0.0
    # The rows flattened (starts, indices, values), built once for every solve of the rows.
    _flat: list[tuple[Any, Any, Any]] = field(default_factory=list)

    def flat_rows(self) -> tuple[Any, Any, Any]:
        """The matrix row by row as numpy arrays (starts, indices, values), as HiGHS takes
        it; cached while no row is added, and shared by the models of `with_bounds`."""
        if self._flat and len(self._flat[0][0]) == self.num_rows + 1:
            return self._flat[0]
        import numpy as np

        lengths = np.fromiter((len(idx) for idx in self.row_index), dtype=np.int64)
        starts = np.zeros(self.num_rows + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        index = np.fromiter(
            (j for idx in self.row_index for j in idx), dtype=np.int32, count=int(starts[-1])
        )
        value = np.fromiter(
            (v for val in self.row_value for v in val), dtype=np.float64, count=int(starts[-1])
        )
        self._flat[:] = [(starts, index, value)]
        return starts, index, value

    def var(
        self,
        name: str,
        lower: float = 0.0,
        upper: float = INF,
        cost: float = 0.0,
        integer: bool = True,
    ) -> int:
        self.col_names.append(name)
        self.col_lower.append(lower)
        self.col_upper.append(upper)
        self.col_cost.append(cost)
        self.col_integer.append(integer)
        return len(self.col_names) - 1

    def row(
        self,
        name: str,
        terms: Iterable[tuple[int, float]],
        lower: float = -INF,
        upper: float = INF,
    ) -> int | None:
        """Add `lower <= sum(coef * x) <= upper`; terms on the same column add up. Empty rows are dropped."""
        merged: dict[int, float] = {}
        for col, coef in terms:
            if col in merged:
                merged[col] += coef
            else:
                merged[col] = coef
        index = [c for c, v in merged.items() if v != 0.0]
        if not index:
            return None
        self.row_names.append(name)
        self.row_lower.append(lower)
        self.row_upper.append(upper)
        self.row_index.append(index)
        self.row_value.append([merged[c] for c in index])
        return len(self.row_names) - 1

    def with_bounds(self, lower: list[float], upper: list[float]) -> LinearModel:
        """The same rows and costs with other column bounds (the rows are shared, not copied)."""
        return LinearModel(
            self.col_names,
            lower,
            upper,
            self.col_cost,
            self.col_integer,
            self.row_names,
            self.row_lower,
            self.row_upper,
            self.row_index,
            self.row_value,
            self.offset,
            self._flat,
        )

    def add_cost(self, col: int, cost: float) -> None:
        self.col_cost[col] += cost

    @property
    def num_cols(self) -> int:
        return len(self.col_names)

    @property
    def num_rows(self) -> int:
        return len(self.row_names)

    def objective(self, x: Sequence[float]) -> float:
        return self.offset + sum(c * v for c, v in zip(self.col_cost, x, strict=True) if c)

    def violations(self, x: Sequence[float], tol: float = 1e-6) -> list[str]:
        """Rows and bounds that `x` breaks (used to check a warm start before handing it over)."""
        bad: list[str] = []
        for j, v in enumerate(x):
            if v < self.col_lower[j] - tol or v > self.col_upper[j] + tol:
                bad.append(
                    f"{self.col_names[j]} = {v} outside [{self.col_lower[j]}, {self.col_upper[j]}]"
                )
            elif self.col_integer[j] and abs(v - round(v)) > tol:
                bad.append(f"{self.col_names[j]} = {v} is not integer")
        for i, (idx, val) in enumerate(zip(self.row_index, self.row_value, strict=True)):
            act = sum(x[j] * a for j, a in zip(idx, val, strict=True))
            scale = tol * max(1.0, abs(act))
            if act < self.row_lower[i] - scale or act > self.row_upper[i] + scale:
                bad.append(
                    f"{self.row_names[i]}: {act} outside [{self.row_lower[i]}, {self.row_upper[i]}]"
                )
        return bad

    def activity(self, row: int, x: Sequence[float]) -> float:
        return sum(x[j] * a for j, a in zip(self.row_index[row], self.row_value[row], strict=True))


@dataclass(frozen=True, slots=True)
class LinearSolution:
    """What a backend found: values (None when it found nothing), objective, proven bound."""

    status: str  # optimal | feasible | time-limit | infeasible | error
    values: tuple[float, ...] | None
    objective: float | None
    bound: float | None
    seconds: float  # measured, recorded: never used to decide
    solver: str
    # The wall-clock backstop, not the node budget, the gap or a target, ended the solve:
    # the same model may solve otherwise on another run (docs/placement.md).
    clock_stopped: bool = False


@dataclass(frozen=True, slots=True)
class SolveLimits:
    """How a solve stops: the gap, the node budget (deterministic: the primary stop) and the
    wall clock (a backstop only; a solve it ends is flagged `clock_stopped`)."""

    time_limit_s: float
    gap: float
    node_limit: int | None = None  # branch-and-bound nodes; None: no limit
    threads: int = 1
    relax: bool = False  # solve the LP relaxation only
    extra: tuple[tuple[str, float | int | bool | str], ...] = ()  # backend options, by name


def solve(
    model: LinearModel, solver: str, limits: SolveLimits, warm: Sequence[float] | None = None
) -> LinearSolution:
    """Solve with `solver` ('highs', 'cbc' or 'cpsat'); `warm` is a feasible start (kept if
    nothing better)."""
    started = time.perf_counter()
    if model.num_cols == 0:  # nothing to decide: the constant is the optimum
        return LinearSolution("optimal", (), model.offset, model.offset, 0.0, solver)
    if solver == "highs":
        result = _solve_highs(model, limits, warm)
    elif solver == "cbc":
        result = _solve_cbc(model, limits, warm)
    elif solver == "cpsat":
        # CP-SAT answers no LP relaxation (it has no continuous columns, and its own LP is
        # internal): the relaxation a relax-and-fix solve starts from is HiGHS's, the
        # integer solves CP-SAT's.
        result = (
            _solve_highs(model, limits, None) if limits.relax else _solve_cpsat(model, limits, warm)
        )
    else:
        raise ValueError(f"unknown MILP backend {solver!r}")
    status, values, objective, bound, clock_stopped = result
    return LinearSolution(
        status=status,
        values=values,
        objective=objective,
        bound=bound,
        seconds=time.perf_counter() - started,
        solver=solver,
        clock_stopped=clock_stopped,
    )


# status, values, objective, bound, and whether the wall clock stopped the solve
_Result = tuple[str, tuple[float, ...] | None, float | None, float | None, bool]


def _new_highs(highspy: Any) -> Any:
    """A HiGHS instance that has printed nothing, and prints nothing unless HIGHS_LOG is set.

    HiGHS writes its banner ("Running HiGHS ... Copyright ...") to stdout on the first
    call of an instance method while `output_flag` is on, its default. highspy >= 1.8's
    `Highs.__init__` makes such a call (`enableCallbacks`) before a caller can turn the
    flag off, so the banner would land in the middle of `--format json`. The compiled
    class underneath (`highspy._core._Highs`) does nothing on construction; we need none
    of the Python callbacks. Older highspy, whose `Highs()` is that class, is used as is.
    """
    core = getattr(highspy, "_core", None)
    cls = getattr(core, "_Highs", None) or highspy.Highs
    h = cls()
    h.setOptionValue("output_flag", bool(__import__("os").environ.get("HIGHS_LOG")))
    return h


def _highs_errors(highspy: Any) -> tuple[type[Exception], ...]:
    """What highspy raises when HiGHS itself fails: pybind11 turns a C++ exception into
    RuntimeError (std::bad_alloc into MemoryError, which solvers.solve catches anywhere);
    highspy >= 1.8's Python layer raises HighsError. A TypeError or ValueError means we
    handed it something wrong, and is not caught."""
    own = getattr(highspy, "HighsError", None)
    return (RuntimeError, own) if isinstance(own, type) else (RuntimeError,)


def _solve_highs(model: LinearModel, limits: SolveLimits, warm: Sequence[float] | None) -> _Result:
    try:
        import highspy
    except ImportError as e:
        raise SolverFailed(f"highspy is not installed: {e}") from e
    import numpy as np

    lower = np.asarray(model.col_lower, dtype=np.float64)
    upper = np.asarray(model.col_upper, dtype=np.float64)
    cost = np.asarray(model.col_cost, dtype=np.float64)
    row_lower = np.asarray(model.row_lower, dtype=np.float64)
    row_upper = np.asarray(model.row_upper, dtype=np.float64)
    starts, index, value = model.flat_rows()
    integer = np.asarray(model.col_integer, dtype=bool)
    offset = model.offset
    # Columns fixed by their bounds (a neighbourhood search fixes most of them) leave the
    # model here: their part moves into the row bounds and the offset, so the solver's
    # presolve never reads the rest of the matrix.
    fixed = lower == upper
    free = np.flatnonzero(~fixed)
    reduced = len(free) < 0.8 * model.num_cols and model.num_rows > 0
    if reduced:
        x = np.where(fixed, lower, 0.0)
        row_of = np.repeat(np.arange(model.num_rows), np.diff(starts))
        constant = np.bincount(row_of, weights=value * x[index], minlength=model.num_rows)
        keep = ~fixed[index]
        live = np.bincount(row_of[keep], minlength=model.num_rows) > 0
        tol = 1e-6 * np.maximum(1.0, np.abs(constant))
        dead = ~live
        if np.any(dead & ((constant < row_lower - tol) | (constant > row_upper + tol))):
            return "infeasible", None, None, None, False
        offset += float(cost[fixed] @ lower[fixed])
        new_col = np.full(model.num_cols, -1, dtype=np.int32)
        new_col[free] = np.arange(len(free), dtype=np.int32)
        keep &= live[row_of]
        index = new_col[index[keep]]
        value = value[keep]
        counts = np.bincount(row_of[keep], minlength=model.num_rows)[live]
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        row_lower = (row_lower - constant)[live]
        row_upper = (row_upper - constant)[live]
        lower, upper, cost, integer = lower[free], upper[free], cost[free], integer[free]
        if len(free) == 0:  # nothing left to decide: the constant is the optimum
            return "optimal", tuple(model.col_lower), offset, offset, False
    inf = highspy.kHighsInf
    lp: Any = highspy.HighsLp()
    lp.num_col_ = len(lower)
    lp.num_row_ = len(row_lower)
    lp.col_cost_ = cost
    lp.col_lower_ = np.where(np.isinf(lower), -inf, lower)
    lp.col_upper_ = np.where(np.isinf(upper), inf, upper)
    lp.row_lower_ = np.where(np.isinf(row_lower), -inf, row_lower)
    lp.row_upper_ = np.where(np.isinf(row_upper), inf, row_upper)
    lp.offset_ = offset
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = len(lower)
    lp.a_matrix_.num_row_ = len(row_lower)
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    mip = not limits.relax and bool(integer.any())
    if mip:
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
            for i in integer.tolist()
        ]
    start: Any = None
    if warm is not None and not limits.relax:
        start = highspy.HighsSolution()
        start.col_value = list(np.asarray(warm, dtype=np.float64)[free] if reduced else warm)
        start.value_valid = True
    try:
        h = _new_highs(highspy)
        h.setOptionValue("time_limit", max(0.05, float(limits.time_limit_s)))
        h.setOptionValue("mip_rel_gap", float(limits.gap))
        h.setOptionValue("threads", int(limits.threads))
        h.setOptionValue("random_seed", 0)
        if limits.node_limit is not None and mip:
            h.setOptionValue("mip_max_nodes", max(1, int(limits.node_limit)))
        for option, setting in limits.extra:
            h.setOptionValue(option, setting)
        h.passModel(lp)
        if start is not None:
            h.setSolution(start)
        h.run()
        status: Any = h.getModelStatus()
        info: Any = h.getInfo()
        has_values = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
        col_value = h.getSolution().col_value if has_values else None
    except _highs_errors(highspy) as e:
        raise SolverFailed(f"HiGHS failed: {e}") from e
    ms = highspy.HighsModelStatus
    values: tuple[float, ...] | None = None
    if has_values:
        solved = np.asarray(col_value, dtype=np.float64)
        if reduced:
            full = np.asarray(model.col_lower, dtype=np.float64)
            full[free] = solved
            solved = full
        values = tuple(solved.tolist())
    objective = float(info.objective_function_value) if has_values else None
    clock_stopped = status == ms.kTimeLimit
    if status == ms.kOptimal:
        state = "optimal"
    elif status == ms.kInfeasible:
        state = "infeasible"
    elif status in (
        ms.kTimeLimit,
        ms.kInterrupt,
        ms.kIterationLimit,
        ms.kSolutionLimit,  # mip_max_nodes: the node budget
        ms.kObjectiveTarget,  # stopped at the objective_target a caller set
    ):
        state = "time-limit"
    else:
        state = "error"
    if not mip:
        bound = objective if state == "optimal" else None
    else:
        raw = float(info.mip_dual_bound)
        bound = raw if math.isfinite(raw) and abs(raw) < 1e30 else None
    if state == "time-limit" and values is not None:
        state = "feasible"
    return state, values, objective, bound, clock_stopped


def _solve_cbc(model: LinearModel, limits: SolveLimits, warm: Sequence[float] | None) -> _Result:
    try:
        import pulp
    except ImportError as e:
        raise SolverFailed(f"PuLP is not installed: {e}") from e

    prob: Any = pulp.LpProblem("placement", pulp.LpMaximize)
    cols: list[Any] = []
    for j in range(model.num_cols):
        upper = model.col_upper[j]
        cat = "Integer" if model.col_integer[j] and not limits.relax else "Continuous"
        var: Any = prob.add_variable(
            f"x{j}", lowBound=model.col_lower[j], upBound=None if upper == INF else upper, cat=cat
        )
        cols.append(var)
    prob += pulp.lpSum(c * cols[j] for j, c in enumerate(model.col_cost) if c) + model.offset
    for i, (idx, val) in enumerate(zip(model.row_index, model.row_value, strict=True)):
        expr: Any = pulp.LpAffineExpression([(cols[j], a) for j, a in zip(idx, val, strict=True)])
        lo, hi = model.row_lower[i], model.row_upper[i]
        if lo == hi:
            prob += (expr == lo), f"r{i}"
        else:
            if hi != INF:
                prob += (expr <= hi), f"r{i}u"
            if lo != -INF:
                prob += (expr >= lo), f"r{i}l"
    use_warm = warm is not None and not limits.relax
    if use_warm:
        assert warm is not None
        for var, v in zip(cols, warm, strict=True):
            var.setInitialValue(round(v) if var.cat == "Integer" else v)
    with warnings.catch_warnings():
        # PuLP 3 deprecates the bundled-CBC command; it is the one that ships with the wheel.
        warnings.simplefilter("ignore", DeprecationWarning)
        return _run_cbc(prob, cols, model, limits, use_warm)


def _run_cbc(
    prob: Any, cols: list[Any], model: LinearModel, limits: SolveLimits, use_warm: bool
) -> _Result:
    import pulp

    time_limit = max(1, math.ceil(limits.time_limit_s))
    cmd: Any = pulp.PULP_CBC_CMD(
        msg=False,
        timeLimit=time_limit,
        maxNodes=None if limits.node_limit is None else max(1, int(limits.node_limit)),
        gapRel=float(limits.gap),
        warmStart=use_warm,
        # CBC's `-threads 1` starts one worker thread beside the main one, and CBC 2.10.3
        # (PuLP's bundled build) sometimes deadlocks handing it the root: the main thread
        # waits out the whole time limit on a 16-column model (1 run in ~150, measured).
        # Without `-threads` CBC searches serially in the main thread, as one thread should.
        threads=int(limits.threads) if limits.threads > 1 else None,
        mip=not limits.relax,
    )
    began = time.perf_counter()
    try:
        prob.solve(cmd)
    except pulp.PulpSolverError:  # CBC could not run or wrote no solution: a status
        return "error", None, None, None, False
    except OSError as e:  # PuLP's temporary files and its CBC process, unwrapped by PuLP
        raise SolverFailed(f"CBC could not run: {e}") from e
    # PuLP does not say why CBC stopped short; a stop short of optimal that took the whole
    # time limit was the clock's (this only labels the solve, it decides nothing).
    ran_out = time.perf_counter() - began >= 0.95 * time_limit
    sol_status = int(prob.sol_status)
    values_raw = [var.varValue for var in cols]
    has_values = sol_status in (1, 2) and all(v is not None for v in values_raw)
    values = tuple(float(v) for v in values_raw) if has_values else None
    objective = model.objective(values) if values is not None else None
    if sol_status == 1:
        state = "optimal"
    elif sol_status == 2:
        state = "feasible"
    elif sol_status == -1:
        state = "infeasible"
    else:
        state = "error"
    # CBC through PuLP does not report its dual bound: an optimal stop is within gapRel.
    bound: float | None = None
    if state == "optimal" and objective is not None:
        bound = objective + (0.0 if limits.relax else float(limits.gap) * abs(objective))
    return state, values, objective, bound, ran_out and state != "optimal"


# -- CP-SAT ------------------------------------------------------------------------------
# CP-SAT takes integer columns and integer rows only (docs/solver.md, "CP-SAT").
# A continuous column x becomes an integer y = x * CPSAT_RESOLUTION: x on a grid of 1/1000
# (a milli-GPU, the unit every GPU request is written in, so the auxiliary columns of quota
# and nominal use land on the grid exactly; a fair-share shortfall may not, and is then
# charged up to 1/1000 of a share more than it is).
CPSAT_RESOLUTION = 1000
# A row whose coefficients are all rationals of denominator <= CPSAT_DENOMINATOR, the least
# common multiple of them at most CPSAT_MULTIPLIER, is multiplied by it and taken exactly
# (milli-GPU, milli-CPU and MiB-in-GiB coefficients are: 1/1000, 1/1024; a fair share's
# usage over the cluster's capacity has the capacity, in milli or MiB, as denominator);
# any other is rounded outward.
CPSAT_DENOMINATOR = 10**10
CPSAT_MULTIPLIER = 10**12
# An unbounded column: CP-SAT's domains are finite. Far above any count or GPU total here.
CPSAT_UNBOUNDED = 10**9
# CP-SAT rejects a row whose activity may overflow int64; ours stay far below this.
CPSAT_MAX_ACTIVITY = 2**60
CPSAT_MAX_OBJECTIVE = 2**60  # the objective's largest activity, once scaled to integers
# The deterministic stop: CP-SAT's deterministic time (a count of its work, "as close as
# possible to a second" on the machine it was calibrated on) per branch-and-bound node of
# the Policy's nodeLimit, so one Policy field budgets every engine. Measured: docs/solver.md.
CPSAT_WORK_PER_NODE = 0.01
# One worker, its subsolvers interleaved (`interleave_search`): the portfolio (LNS,
# feasibility jump, the LP-based search) on one thread, deterministic by construction.
# Two workers interleaved are deterministic too; measured against one in docs/solver.md.
CPSAT_WORKERS = 1
CPSAT_SEED = 0
_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class IntegerRow:
    """One row of the model over integer columns: lower <= sum(coef * y) <= upper."""

    name: str
    index: tuple[int, ...]
    coef: tuple[int, ...]
    lower: int | None
    upper: int | None
    exact: bool  # False: rounded outward (never admits what the row forbids)


@dataclass(frozen=True, slots=True)
class IntegerModel:
    """`LinearModel` over integer columns, as CP-SAT takes it: y_j = x_j * scale_j."""

    scale: tuple[int, ...]
    lower: tuple[int, ...]
    upper: tuple[int, ...]
    rows: tuple[IntegerRow, ...]
    # The objective in integers: c_j * objective_scale, rounded.
    objective: tuple[int, ...]
    objective_scale: float
    # What the grid of the continuous columns and the rounded objective may cost, at most:
    # added to the bound CP-SAT proves on the integer model to give a bound of the linear
    # model.
    slack: float
    # Columns fixed by their bounds (a neighbourhood fixes most), by value: they leave the
    # rows (into the rows' bounds) and the objective (into `constant`), so a fixed value off
    # the grid (an auxiliary column fixed where its terms put it) costs no precision.
    fixed: tuple[float | None, ...] = ()
    constant: float = 0.0
    feasible: bool = True  # False: a row of fixed columns only breaks its bounds

    def values(self, solution: Sequence[int]) -> tuple[float, ...]:
        """The linear model's column values of an integer solution."""
        return tuple(
            f if f is not None else y / s
            for y, s, f in zip(solution, self.scale, self.fixed, strict=True)
        )

    @property
    def exact(self) -> bool:
        return all(r.exact for r in self.rows)


def integer_model(model: LinearModel) -> IntegerModel:
    """The model with every column integer and every row integral (docs/solver.md):
    continuous columns on a grid of 1/CPSAT_RESOLUTION, rows of small-denominator
    coefficients multiplied out exactly, other rows rounded outward over non-negative
    columns. A row it cannot take (outward rounding over a column that may go negative,
    an activity that may overflow) raises SolverFailed naming the row."""
    scale = tuple(1 if i else CPSAT_RESOLUTION for i in model.col_integer)
    fixed = tuple(
        lo if lo == hi and math.isfinite(lo) else None
        for lo, hi in zip(model.col_lower, model.col_upper, strict=True)
    )
    lower: list[int] = []
    upper: list[int] = []
    implied = _implied_upper(model)
    for j, (lo, hi) in enumerate(zip(model.col_lower, implied, strict=True)):
        s = scale[j]
        if fixed[j] is not None:
            lower.append(0)
            upper.append(0)
            continue
        lower.append(
            -CPSAT_UNBOUNDED if lo == -INF else math.ceil(lo * s - _TOL * max(1, abs(lo * s)))
        )
        if hi == INF:
            upper.append(CPSAT_UNBOUNDED)
        elif hi != model.col_upper[j]:
            # A bound the rows imply, not the column's own: up to the grid, so that it
            # never cuts a value the rows allow.
            upper.append(math.ceil(hi * s - _TOL * max(1, abs(hi * s))))
        else:
            upper.append(math.floor(hi * s + _TOL * max(1, abs(hi * s))))
        if lower[-1] > upper[-1]:
            raise SolverFailed(
                f"cpsat cannot take column {model.col_names[j]}: [{lo}, {hi}] holds no "
                f"multiple of 1/{s}"
            )
    rows: list[IntegerRow] = []
    feasible = True
    for i, (idx, val) in enumerate(zip(model.row_index, model.row_value, strict=True)):
        shift = 0.0
        terms: list[tuple[int, float]] = []
        for j, a in zip(idx, val, strict=True):
            value = fixed[j]
            if value is None:
                terms.append((j, a / scale[j]))
            else:
                shift += a * value
        lo, hi = model.row_lower[i] - shift, model.row_upper[i] - shift
        if not terms:
            tol = 1e-6 * max(1.0, abs(shift))
            feasible = feasible and lo <= tol and hi >= -tol
            continue
        rows.extend(_integer_rows(model.row_names[i], terms, lo, hi, lower, upper))
    cost = [
        0.0 if f is not None else c / s
        for c, s, f in zip(model.col_cost, scale, fixed, strict=True)
    ]
    constant = sum(c * f for c, f in zip(model.col_cost, fixed, strict=True) if f is not None and c)
    on_grid = _on_grid(model, fixed)
    grid = (
        sum(
            abs(c)
            for j, (c, s) in enumerate(zip(model.col_cost, scale, strict=True))
            if s > 1 and not on_grid[j] and fixed[j] is None
        )
        / CPSAT_RESOLUTION
    )
    reach = [max(abs(lo), abs(hi)) for lo, hi in zip(lower, upper, strict=True)]
    activity = sum(abs(c) * r for c, r in zip(cost, reach, strict=True))
    k = 2.0 ** math.floor(math.log2(CPSAT_MAX_OBJECTIVE / activity)) if activity > 0 else 1.0
    objective = tuple(round(c * k) for c in cost)
    rounding = sum(abs(c - o / k) * r for c, o, r in zip(cost, objective, reach, strict=True) if c)
    return IntegerModel(
        scale,
        tuple(lower),
        tuple(upper),
        tuple(rows),
        objective,
        k,
        grid + rounding,
        fixed,
        constant,
        feasible,
    )


def _lattice(value: float) -> bool:
    """Whether `value` is a multiple of 1/CPSAT_RESOLUTION (a milli-GPU)."""
    scaled = value * CPSAT_RESOLUTION
    return not math.isfinite(value) or abs(scaled - round(scaled)) <= 1e-6 * max(1.0, abs(scaled))


def _on_grid(model: LinearModel, fixed: Sequence[float | None]) -> list[bool]:
    """The continuous columns the grid costs nothing: every row of the column bounds it alone
    (coefficient +-1, the row's only continuous column) by a multiple of 1/1000 once the
    integer columns are set (their coefficients and the row's bounds are such multiples), so
    its best value, an end of the interval its rows and bounds leave, lies on the grid (the
    nominal-quota and quota-excess columns: usage in milli-GPU). A row that only ever gains
    as a column moves the way its cost pulls it (`levels__nominal`: level 1 >= a value, over
    columns that cost) does not move that end, and is passed over for the column."""
    ok = [
        not integer and _lattice(lo) and _lattice(hi)
        for integer, lo, hi in zip(model.col_integer, model.col_lower, model.col_upper, strict=True)
    ]
    for i, (idx, val) in enumerate(zip(model.row_index, model.row_value, strict=True)):
        moving = [
            (j, a)
            for j, a in zip(idx, val, strict=True)
            if not model.col_integer[j] and fixed[j] is None
        ]
        continuous = [
            j
            for j, a in moving
            if not _with_the_cost(model.col_cost[j] * a, model.row_lower[i], model.row_upper[i])
        ]
        if not continuous:
            continue
        fits = (
            len(moving) == 1
            and _lattice(model.row_lower[i])
            and _lattice(model.row_upper[i])
            and all(
                abs(a) == 1.0
                if j == continuous[0]
                else _lattice(a if fixed[j] is None else a * (fixed[j] or 0.0))
                for j, a in zip(idx, val, strict=True)
            )
        )
        if not fits:
            for j in continuous:
                ok[j] = False
    return ok


def _with_the_cost(pull: float, lower: float, upper: float) -> bool:
    """Whether a row only gains as a column moves the way its cost pulls it: `pull` is the
    column's cost times its coefficient in the row (> 0: the row's activity rises as the
    objective does), the row bounded only on the other side."""
    return (pull > 0 and upper == INF) or (pull < 0 and lower == -INF)


def _implied_upper(model: LinearModel) -> list[float]:
    """The columns' upper bounds, an unbounded one replaced where a row bounds it: a <= row
    over columns otherwise bounded (what the cohort pool leaves a queue to borrow), or, for
    a column of one row that costs (a shortfall below a fair share), the least value its
    >= row asks of it, which some optimal solution takes."""
    upper = list(model.col_upper)
    lower = model.col_lower
    rows_of = [0] * model.num_cols
    for idx in model.row_index:
        for j in idx:
            rows_of[j] += 1
    for i, (idx, val) in enumerate(zip(model.row_index, model.row_value, strict=True)):
        unbounded = [(j, a) for j, a in zip(idx, val, strict=True) if upper[j] == INF and a > 0]
        if len(unbounded) != 1:
            continue
        j, a = unbounded[0]
        rest = [(k, b) for k, b in zip(idx, val, strict=True) if k != j]
        if any(lower[k] == -INF or model.col_upper[k] == INF for k, _ in rest):
            continue
        low = sum(min(b * lower[k], b * model.col_upper[k]) for k, b in rest)
        if model.row_upper[i] != INF:
            upper[j] = min(upper[j], (model.row_upper[i] - low) / a)
        elif rows_of[j] == 1 and model.col_cost[j] < 0 and model.row_lower[i] != -INF:
            upper[j] = max(lower[j], (model.row_lower[i] - low) / a, 0.0)
    return upper


def _integer_rows(
    name: str,
    terms: list[tuple[int, float]],
    lo: float,
    hi: float,
    lower: list[int],
    upper: list[int],
) -> list[IntegerRow]:
    index = tuple(j for j, _ in terms)
    fractions = [Fraction(a).limit_denominator(CPSAT_DENOMINATOR) for _, a in terms]
    # The rational is the coefficient where it rounds to the same double.
    exact = all(float(f) == a for f, (_, a) in zip(fractions, terms, strict=True))
    multiplier = 1
    if exact:
        for f in fractions:
            multiplier = math.lcm(multiplier, f.denominator)
        exact = multiplier <= CPSAT_MULTIPLIER
    coef = tuple(int(f * multiplier) for f in fractions) if exact else ()
    if exact and _reach(index, coef, lower, upper) <= CPSAT_MAX_ACTIVITY:
        out = [_bounded(name, index, coef, lo, hi, float(multiplier), 0.0, lower, upper)]
    else:
        # Outward: every integer solution of the rounded row satisfies the row. Over a
        # column >= 0, a <= row takes each coefficient rounded up, a >= row rounded down;
        # as finely as 64 bits allow (2x headroom for the rounding), so that what the
        # rounding takes from the row is at most one unit of each column's range.
        if any(lower[j] < 0 for j in index):
            raise SolverFailed(
                f"cpsat cannot take row {name}: fractional coefficients over a column that "
                "may be negative cannot be rounded soundly"
            )
        reach = max(
            sum(abs(a) * max(abs(lower[j]), abs(upper[j])) for j, a in terms),
            max(abs(a) for _, a in terms),
        )
        m = float(2 ** max(0, math.floor(math.log2(CPSAT_MAX_ACTIVITY / (2 * reach)))))
        out = []
        if hi != INF:
            up = tuple(math.ceil(a * m) for _, a in terms)
            loss = _loss(index, up, terms, m, upper)
            out.append(_bounded(name, index, up, -INF, hi, m, loss, lower, upper))
        if lo != -INF:
            down = tuple(math.floor(a * m) for _, a in terms)
            loss = _loss(index, down, terms, m, upper)
            out.append(_bounded(name, index, down, lo, INF, m, loss, lower, upper))
    return out


def _loss(
    index: tuple[int, ...],
    coef: tuple[int, ...],
    terms: list[tuple[int, float]],
    multiplier: float,
    upper: list[int],
) -> float:
    """The most an outward-rounded row's integer activity differs from the row's own (times
    `multiplier`), over non-negative columns."""
    return sum(
        abs(c - a * multiplier) * upper[j] for j, c, (_, a) in zip(index, coef, terms, strict=True)
    )


def _bounded(
    name: str,
    index: tuple[int, ...],
    coef: tuple[int, ...],
    lo: float,
    hi: float,
    multiplier: float,
    loss: float,
    lower: list[int],
    upper: list[int],
) -> IntegerRow:
    """The row with integer bounds. `loss`: what outward rounding may take from the row's
    activity (0 for a row multiplied out exactly). Every row's bounds get 10^-6 of slack
    for float noise (the tolerance HiGHS works to); an outward-rounded row whose loss fits
    in that slack loses no plan the exact row would keep, and counts as exact: CP-SAT's
    bound is then a bound of the linear model (the rows' slack is the one approximation)."""
    if _reach(index, coef, lower, upper) > CPSAT_MAX_ACTIVITY:
        raise SolverFailed(f"cpsat cannot take row {name}: its activity may overflow 64 bits")
    # Integer activity: a bound a float sum misses by rounding noise is taken at its integer.
    lo_s, hi_s = lo * multiplier, hi * multiplier
    lo_slack, hi_slack = 1e-6 * max(1.0, abs(lo_s)), 1e-6 * max(1.0, abs(hi_s))
    return IntegerRow(
        name,
        index,
        coef,
        None if lo == -INF else math.ceil(lo_s - lo_slack),
        None if hi == INF else math.floor(hi_s + hi_slack),
        # An integer activity within `loss` of one that meets the row meets the slackened
        # bound too (the bound's rounding to an integer is inward of every such activity).
        loss == 0.0 or loss <= (lo_slack if hi == INF else hi_slack),
    )


def _reach(
    index: tuple[int, ...], coef: tuple[int, ...], lower: list[int], upper: list[int]
) -> int:
    """The largest |activity| a row may take over its columns' domains."""
    return sum(abs(c) * max(abs(lower[j]), abs(upper[j])) for j, c in zip(index, coef, strict=True))


def cpsat_work(limits: SolveLimits) -> float:
    """The deterministic time a CP-SAT solve may spend: the node budget in CP-SAT's unit."""
    nodes = 100_000 if limits.node_limit is None else max(1, int(limits.node_limit))
    return nodes * CPSAT_WORK_PER_NODE


def _solve_cpsat(model: LinearModel, limits: SolveLimits, warm: Sequence[float] | None) -> _Result:
    try:
        from ortools.sat.python import cp_model
    except ImportError as e:
        raise SolverFailed(f"ortools is not installed: {e}") from e

    im = integer_model(model)
    cp: Any = cp_model.CpModel()
    ys = [
        cp.new_int_var(lo, hi, f"x{j}")
        for j, (lo, hi) in enumerate(zip(im.lower, im.upper, strict=True))
    ]
    if not im.feasible:
        return "infeasible", None, None, None, False
    for row in im.rows:
        expr = cp_model.LinearExpr.weighted_sum([ys[j] for j in row.index], list(row.coef))
        cp.add_linear_constraint(
            expr,
            -(2**62) if row.lower is None else row.lower,
            2**62 if row.upper is None else row.upper,
        )
    priced = [j for j, c in enumerate(im.objective) if c]
    if priced:
        cp.maximize(
            cp_model.LinearExpr.weighted_sum(
                [ys[j] for j in priced], [im.objective[j] for j in priced]
            )
        )
    if warm is not None:
        for j, v in enumerate(warm):
            cp.add_hint(ys[j], min(im.upper[j], max(im.lower[j], round(v * im.scale[j]))))
    solver: Any = cp_model.CpSolver()
    params = solver.parameters
    work = cpsat_work(limits)
    params.max_deterministic_time = work
    params.max_time_in_seconds = max(0.05, float(limits.time_limit_s))  # the backstop
    params.relative_gap_limit = float(limits.gap)
    params.random_seed = CPSAT_SEED
    params.num_workers = CPSAT_WORKERS
    params.interleave_search = True
    params.log_search_progress = bool(__import__("os").environ.get("CPSAT_LOG"))
    for option, setting in limits.extra:
        if option.startswith("cpsat_"):  # the other engines' options are theirs
            setattr(params, option.removeprefix("cpsat_"), setting)
    try:
        code = solver.solve(cp)
    except RuntimeError as e:
        raise SolverFailed(f"CP-SAT failed: {e}") from e
    status = solver.status_name(code)
    if status == "MODEL_INVALID":
        raise SolverFailed(f"CP-SAT rejected the model: {cp.validate()[:300]}")
    values: tuple[float, ...] | None = None
    if status in ("OPTIMAL", "FEASIBLE"):
        values = im.values(solver.response_proto.solution)
    objective = model.objective(values) if values is not None else None
    # A stop short of a proof that did not spend its deterministic budget was the clock's.
    spent = float(solver.response_proto.deterministic_time)
    proved = status in ("OPTIMAL", "INFEASIBLE")
    clock_stopped = not proved and spent < 0.99 * work
    bound: float | None = None
    if priced and status in ("OPTIMAL", "FEASIBLE") and im.exact:
        # From CP-SAT's own integer (its inner objective, minimised), not the float it also
        # reports: past 2^53 that float was seen to differ in its last bit between two runs
        # of one solve (plan and reconcile then disagree on the bound).
        objective_proto: Any = cp.proto.objective
        inner = int(solver.response_proto.inner_objective_lower_bound)
        if abs(inner) < 2**62:
            scaling = float(objective_proto.scaling_factor) or 1.0  # 0 reads as 1 (the proto)
            raw_bound = scaling * (inner + float(objective_proto.offset))
            bound = raw_bound / im.objective_scale + im.constant + model.offset + im.slack
    elif not priced and status == "OPTIMAL":
        bound = im.constant + model.offset
    if status == "OPTIMAL":
        state = "optimal"
    elif status == "FEASIBLE":
        state = "feasible"
    elif status == "INFEASIBLE":
        state = "infeasible" if im.exact else "error"  # rounding outward may lose plans
    elif status == "UNKNOWN":
        state = "time-limit"
    else:
        state = "error"
    return state, values, objective, bound, clock_stopped
