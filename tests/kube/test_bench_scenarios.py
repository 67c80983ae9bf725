"""`gitsched bench kube --scenario gang-burst|starvation` on the real API server: pods run a
fixed time and end (kwok's test stage), and what must always hold does — no gang ever partly
bound, every job finished, the starved gang started before the stream ended. The timing goals
(makespan ratio, wait against the reservation) are figures in docs/kubernetes.md, not asserts."""

from __future__ import annotations

import os
import threading
from typing import Any, cast

import pytest
import urllib3

from gitsched.bench import kube_scenarios
from gitsched.bench.kube_scenarios import OUTCOME_ANNOTATION
from gitsched.cluster.api import KubeApi
from gitsched.policies.policy import default_policy
from gitsched.reconciler.specs import policy_of
from tests.support.kube import ENV_VAR, gitsched_for

pytestmark = pytest.mark.kube


def _bench(*args: str) -> dict[str, Any]:
    # The bench stops itself (and cleans up) at --timeout; the test waits a little longer.
    run = gitsched_for(
        300,
        "bench",
        "kube",
        "--kubeconfig",
        os.environ[ENV_VAR],
        *args,
        "--timeout",
        "240",
        "--format",
        "json",
    )
    assert run.returncode == 0, str(run)
    result = run.json()
    assert isinstance(result, dict)  # one JSON document, one object
    return result


def _nodes(api: KubeApi) -> set[str]:
    """Bench runs' nodes: other tests on the shared server add and remove their own."""
    return {n["metadata"]["name"] for n in api.list("nodes", "gitsched.io/bench-run").items}


def _bench_pods(api: KubeApi) -> set[str]:
    """The pods of bench runs (their namespaces are bench-<run>)."""
    return {
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in api.list("pods").items
        if p["metadata"]["namespace"].startswith("bench-")
    }


def test_gang_burst_finishes_every_gang_never_partly_bound_and_no_sooner_than_the_bound(
    kube_api: KubeApi,
) -> None:
    before, pods_before = _nodes(kube_api), _bench_pods(kube_api)
    r = _bench("--scenario", "gang-burst", "--nodes", "4", "--rounds", "2", "--run-seconds", "15")
    sizes = r["gang_sizes_pods"]
    # Mixed sizes that fill the 4 nodes exactly twice: the lower bound is two run times.
    assert len(set(sizes)) > 1 and sum(sizes) == r["pods"] == 4 * 2
    assert r["jobs"] == len(sizes) and r["time_limit_minutes"] == 1
    # No Policy in the repo: the built-in one decides.
    assert r["solver"] == policy_of(default_policy()).solver
    assert r["lower_bound_s"] == 2 * 15.0
    # After every pass of the daemon, every gang had all of its pods bound or none.
    assert r["passes"] > 0 and r["partly_bound_gangs"] == 0
    assert r["jobs_finished"] == r["jobs"] and r["jobs_timed_out"] == 0
    assert r["pods_deleted"] == 0  # nothing preempted or stopped
    # No schedule beats the bound; every pod ran its full time.
    assert r["makespan_s"] >= r["lower_bound_s"]
    assert r["makespan_ratio"] == round(r["makespan_s"] / r["lower_bound_s"], 3)
    assert 0 < r["mean_gpu_occupancy"] <= 1
    # Its nodes and pods are gone again.
    assert _nodes(kube_api) <= before
    assert _bench_pods(kube_api) <= pods_before


def test_starvation_the_gang_gets_a_reservation_and_starts_before_the_stream_ends(
    kube_api: KubeApi,
) -> None:
    before, pods_before = _nodes(kube_api), _bench_pods(kube_api)
    r = _bench(
        "--scenario",
        "starvation",
        "--nodes",
        "3",
        "--gang-pods",
        "2",
        "--run-seconds",
        "15",
        "--stream-seconds",
        "30",
    )
    assert (r["gpus"], r["fill_jobs"]) == (24, 24)  # the cluster full of 1-GPU jobs
    assert r["solver"] == policy_of(default_policy()).solver and r["reservations_policy"] is None
    assert r["stream_jobs"] > r["fill_jobs"]
    # Waiting, the gang held a reservation, and its reason named it.
    assert str(r["gang_reason"]).startswith("reserved from ")
    assert r["first_reservation_start_s"] is not None
    # The stream did not starve it: it was placed while 1-GPU jobs were still coming.
    assert r["started_before_stream_end"] is True
    assert 0 <= r["gang_wait_s"] < r["stream_end_s"]
    assert r["partly_bound_gangs"] == 0
    assert r["jobs_finished"] == r["fill_jobs"] + r["stream_jobs"] + 1
    assert r["jobs_timed_out"] == 0
    assert _nodes(kube_api) <= before
    assert _bench_pods(kube_api) <= pods_before


class _Flaky:
    """The real API, but every thread's first watch breaks, and the first request to end
    each pod (the bench's kwok annotation) is lost: what a loaded CI machine does to a run."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._watched: set[int] = set()
        self._ended: set[str] = set()
        self.broken_watches = 0
        self.lost_ends = 0
        self.core = _FlakyCore(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def watch(self, *args: Any, **kwargs: Any) -> Any:
        thread = threading.get_ident()
        if thread not in self._watched:
            self._watched.add(thread)
            self.broken_watches += 1
            raise urllib3.exceptions.ProtocolError("connection broken: the test's doing")
        return self._api.watch(*args, **kwargs)


class _FlakyCore:
    def __init__(self, flaky: _Flaky) -> None:
        self._flaky = flaky

    def __getattr__(self, name: str) -> Any:
        return getattr(self._flaky._api.core, name)

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        if OUTCOME_ANNOTATION in annotations and name not in self._flaky._ended:
            self._flaky._ended.add(name)
            self._flaky.lost_ends += 1
            raise urllib3.exceptions.ReadTimeoutError(None, "/", "the test's doing")
        return self._flaky._api.core.patch_namespaced_pod(name, namespace, body, **kw)


def test_a_run_survives_broken_watches_and_lost_requests_to_end_a_pod(kube_api: KubeApi) -> None:
    # Seen in CI: a run that waited out its timeout. A pod whose end request was lost ran
    # on to its time limit and was deleted, and the run waited for it to succeed.
    flaky = _Flaky(kube_api)
    r = kube_scenarios.gang_burst(
        cast(KubeApi, flaky), nodes=2, rounds=1, run_s=3, limit_minutes=1, seed=1, timeout_s=50
    )
    assert flaky.broken_watches >= 2 and flaky.lost_ends == r.pods > 0
    assert r.jobs_finished == r.jobs and r.jobs_timed_out == 0
    assert r.makespan_s < 50
