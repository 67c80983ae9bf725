"""Properties of the audit views on simulated logs.

- `at` gives exactly the state `gitsched.eventlog.replay` folds, at every seq;
- a view built in random increments equals one rebuilt from 0, row for row;
- the simulated log the benchmark uses decodes with the real codec.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitsched.audit import history, usage
from gitsched.audit.catchup import catch_up, rebuild
from gitsched.audit.pointintime import cluster_at
from gitsched.audit.store import AuditStore, EventList
from gitsched.engine.codec import to_data
from gitsched.engine.state import ClusterState, evolve
from gitsched.engine.units import GPU_MILLI
from gitsched.eventlog.codec import decode
from gitsched.eventlog.envelope import StoredEvent, verify_chain
from gitsched.simulation.history import synthetic_events, synthetic_log


@cache
def simulated(events: int, seed: int, mean_gap_s: float = 8.0) -> tuple[StoredEvent, ...]:
    return tuple(synthetic_events(events, seed, mean_gap_s))


def expected(state: ClusterState) -> dict[str, Any]:
    return {
        "placements": sorted(
            (k, p.flavor, sorted({r.node for r in p.replicas}), p.gpu_milli / GPU_MILLI)
            for k, p in state.placements.items()
        ),
        "pending": sorted((k, v.reason, v.constraint) for k, v in state.pending.items()),
        "queues": sorted(state.queues),
        "nodes": sorted((n.name, str(n.state)) for n in state.nodes.values()),
        "commit": state.last_commit.sha if state.last_commit else None,
    }


def answered(at: dict[str, Any]) -> dict[str, Any]:
    return {
        "placements": sorted(
            (p["job"], p["flavor"], p["nodes"], p["gpus"]) for p in at["placements"]
        ),
        "pending": sorted((p["job"], p["reason"], p["constraint"]) for p in at["pending"]),
        "queues": sorted(q["name"] for q in at["queues"]),
        "nodes": sorted((n["name"], n["state"]) for n in at["nodes"]),
        "commit": at["commit"]["sha"] if at["commit"] else None,
    }


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000))
def test_at_equals_replay_at_every_seq(seed: int) -> None:
    events = simulated(1200, seed)
    with AuditStore(":memory:") as store:
        catch_up(EventList(events), store)
        state = ClusterState()
        for event in events:
            state = evolve(state, decode(event))
            assert answered(cluster_at(store, event.seq)) == expected(state), event.seq


ROOT = Path(__file__).resolve().parents[2]


def state_fields_that_differ(left: str | None, right: str | None) -> list[str]:
    """The fields of two saved fold states (meta 'state') that differ: what to look at when
    a view's tables differ only there."""
    a, b = json.loads(left or "{}"), json.loads(right or "{}")
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def table_rows(store: AuditStore) -> dict[str, list[str]]:
    tables = [r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: sorted(map(repr, store.db.execute(f"SELECT * FROM {t}"))) for t in tables}


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2),
    steps=st.lists(st.integers(1, 1500), min_size=1, max_size=12),
    batch=st.integers(1, 600),
)
def test_a_view_built_in_increments_equals_one_rebuilt_from_zero(
    seed: int, steps: list[int], batch: int
) -> None:
    # Days long (a step every 5 minutes), so the daily usage roll-up is built in pieces too.
    events = simulated(3000, seed, 300.0)
    with AuditStore(":memory:") as whole, AuditStore(":memory:") as steps_view:
        catch_up(EventList(events), whole)
        upto = 0
        for step in steps:
            upto = min(len(events), upto + step)
            catch_up(EventList(events[:upto]), steps_view, batch_events=batch)
        catch_up(EventList(events), steps_view, batch_events=batch)
        assert table_rows(steps_view) == table_rows(whole)


def test_rebuild_replaces_the_view_and_reruns_skip_what_they_saw(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    log = synthetic_log(path, 4000, 1)
    view = tmp_path / "audit.db"
    with AuditStore(view) as store:
        first = catch_up(log, store, until_seq=2500, verify=True)
        again = catch_up(log, store, until_seq=2500, verify=True)
        rest = catch_up(log, store, verify=True)
        assert (first.applied, again.applied, rest.applied) == (2500, 0, 1500)
        incremental = table_rows(store)
    result = rebuild(log, view)
    assert result.applied == 4000 and result.last_seq == 4000
    with AuditStore(view) as store:
        assert table_rows(store) == incremental
    log.close()


def test_a_rebuild_in_a_writer_process_equals_one_folded_in_process(tmp_path: Path) -> None:
    # Days long, so usage rolls up over many days; small batches, so many frames.
    events = simulated(3000, 1, 300.0)
    with AuditStore(":memory:") as whole:
        catch_up(EventList(events), whole, verify=True)  # as a rebuild does
        expected_rows = table_rows(whole)
        view = tmp_path / "audit.db"
        result = rebuild(EventList(events), view, batch_events=400, writer_process=True)
        assert (result.applied, result.last_seq) == (3000, 3000)
        with AuditStore(view) as store:
            differ = state_fields_that_differ(store.meta("state"), whole.meta("state"))
            assert differ == [], f"the saved state differs in {differ}"
            assert table_rows(store) == expected_rows
        # The state it saved carries on where the fold stopped, usage ledger included.
        rebuild(EventList(events[:1700]), view, batch_events=300, writer_process=True)
        with AuditStore(view) as store:
            assert catch_up(EventList(events), store, verify=True).applied == 1300
            assert table_rows(store) == expected_rows


def test_a_rebuild_saves_the_same_state_whatever_the_hash_seeds(tmp_path: Path) -> None:
    # The writer process starts with a hash seed of its own: pinned here to differ from its
    # folding process's, and both from this one's, so that a set or dict ordered by hash
    # reaching the saved state (or any row) fails every time, not once in a while.
    events = simulated(3000, 1, 300.0)
    with AuditStore(":memory:") as whole:
        catch_up(EventList(events), whole, verify=True)
        expected_rows = table_rows(whole)
        expected_state = whole.meta("state")
    for fold_seed, writer_seed in (("0", "1"), ("2", "3")):
        view = tmp_path / f"audit-{fold_seed}-{writer_seed}.db"
        subprocess.run(
            [sys.executable, "-m", "tests.support.audit_rebuild_probe", str(view), writer_seed],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": fold_seed, "PYTHONPATH": str(ROOT)},
            check=True,
        )
        with AuditStore(view) as store:
            differ = state_fields_that_differ(store.meta("state"), expected_state)
            assert differ == [], f"hash seeds {fold_seed}/{writer_seed}: state differs in {differ}"
            assert table_rows(store) == expected_rows, (fold_seed, writer_seed)


def test_a_rebuild_writes_in_process_when_its_writer_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = simulated(1200, 3)
    with AuditStore(":memory:") as whole:
        catch_up(EventList(events), whole, verify=True)  # as a rebuild does
        for broken in ("/nonexistent/python", shutil.which("false") or "/bin/false"):
            monkeypatch.setattr(sys, "executable", broken)
            view = tmp_path / "audit.db"
            assert rebuild(EventList(events), view, writer_process=True).applied == 1200
            with AuditStore(view) as store:
                assert table_rows(store) == table_rows(whole)
            assert sorted(p.name for p in tmp_path.iterdir()) == ["audit.db"]


def test_the_simulated_log_is_sealed_and_decodes_with_the_real_codec(tmp_path: Path) -> None:
    events = simulated(3000, 5)
    assert len(events) == 3000
    assert verify_chain(events) is None
    for event in events:
        assert to_data(decode(event)) == event.data, event
    kinds = {e.type for e in events}
    assert {"PlacementDecided", "JobPreempted", "JobFinished", "QueueConfigured"} <= kinds
    # The same seed gives the same log, down to the hashes.
    assert [e.hash for e in synthetic_events(3000, 5)] == [e.hash for e in events]
    log = synthetic_log(tmp_path / "log.db", 3000, 5)
    assert [e.hash for e in log.read(0)] == [e.hash for e in events]
    log.close()


def test_random_catch_ups_through_the_sqlite_fast_path(tmp_path: Path) -> None:
    log = synthetic_log(tmp_path / "log.db", 2000, 2)
    with AuditStore(":memory:") as fast, AuditStore(":memory:") as generic:
        rng = random.Random(3)
        upto = 0
        while upto < 2000:
            upto = min(2000, upto + rng.randint(1, 500))
            catch_up(log, fast, until_seq=upto)
        catch_up(EventList(log.read(0)), generic)
        assert table_rows(fast) == table_rows(generic)
    log.close()


@cache
def days_long_view() -> AuditStore:
    """Six thousand events over about a week: checkpoints, whole days and partial ones."""
    store = AuditStore(":memory:")
    catch_up(EventList(simulated(6000, 4, 300.0)), store)
    return store


@settings(max_examples=25, deadline=None)
@given(a=st.floats(0.0, 1.0), b=st.floats(0.0, 1.0))
def test_usage_of_any_period_equals_the_segments_it_covers(a: float, b: float) -> None:
    store = days_long_view()
    first, last = store.db.execute("SELECT MIN(from_ts), MAX(from_ts) FROM segments").fetchone()
    since, until = sorted((first + a * (last - first) * 1.1, first + b * (last - first) * 1.1))
    rolled_up = usage._sums(store, since, until)
    direct = usage._segment_sums(store, since, until)
    assert rolled_up.keys() == direct.keys()
    for key, values in direct.items():
        for got, want in zip(rolled_up[key], values, strict=True):
            assert abs(got - want) <= 1e-6 * max(1.0, abs(want)) + 1.0, (
                key,
                rolled_up[key],
                values,
            )


@settings(max_examples=25, deadline=None)
@given(a=st.floats(0.0, 1.0), b=st.floats(0.0, 1.0), node=st.integers(0, 40))
def test_history_of_any_period_equals_filtering_all_of_it(a: float, b: float, node: int) -> None:
    store = days_long_view()
    first, last = store.db.execute("SELECT MIN(start_ts), MAX(start_ts) FROM placements").fetchone()
    since, until = sorted((first + a * (last - first), first + b * (last - first)))
    everything = history.query(store)
    names = sorted({n for i in everything for n in i.nodes})
    name = names[node % len(names)]

    def overlaps(i: history.Interval) -> bool:
        start = datetime.fromisoformat(i.start).timestamp()
        end = datetime.fromisoformat(i.end).timestamp() if i.end else None
        return start < until and (end is None or end > since)

    assert history.query(store, since=since, until=until) == [i for i in everything if overlaps(i)]
    assert history.query(store, node=name, since=since, until=until) == [
        i for i in everything if overlaps(i) and name in i.nodes
    ]


@settings(max_examples=25, deadline=None)
@given(a=st.floats(0.0, 1.0), b=st.floats(0.0, 1.0))
def test_capacity_by_flavor_of_any_period_equals_every_node_version_it_overlaps(
    a: float, b: float
) -> None:
    store = days_long_view()
    first, last = store.db.execute("SELECT MIN(from_ts), MAX(from_ts) FROM versions").fetchone()
    since, until = sorted((first + a * (last - first) * 1.1, first + b * (last - first) * 1.1))
    want: dict[str, list[float]] = {}
    for data, start, end in store.db.execute(
        "SELECT data, from_ts, to_ts FROM all_versions WHERE kind = 'node'"
    ):
        node = json.loads(data)
        overlap = min(until if end is None else min(end, until), until) - max(start, since)
        if node.get("flavor") is None or overlap <= 0:
            continue
        gpu_s = node["gpus"] * GPU_MILLI * overlap
        entry = want.setdefault(node["flavor"], [0.0, 0.0])
        entry[0] += gpu_s
        entry[1] += 0.0 if node["state"] == "Ready" else gpu_s
    got = {r["flavor"]: r for r in usage.by_flavor(store, since, until)}
    # Rows are in GPU-hours to two decimals (a flavor of a tiny period may show 0).
    for flavor in sorted(got.keys() | want.keys()):
        capacity, down = want.get(flavor, [0.0, 0.0])
        row = got.get(flavor, {"capacity_gpu_h": 0.0, "down_gpu_h": 0.0})
        assert row["capacity_gpu_h"] == pytest.approx(capacity / GPU_MILLI / 3600, abs=0.01)
        assert row["down_gpu_h"] == pytest.approx(down / GPU_MILLI / 3600, abs=0.01)
