"""Make the cluster's pods what the log's placements say: create gated, bind whole gangs, delete the rest.

Level-based: every pass compares the pods that exist with the pods the folded
state asks for, so a crash anywhere is repaired by the next pass, and running
it twice changes nothing. No duplicate pod: names are deterministic and a 409
on create means it exists (progress). No double bind: a Binding names the pod's
uid and a bound pod answers 409.

Why gated pods plus a Binding for a gang, not `nodeName` at creation: a pod
created with its node starts on it at once, so a gang would run in part while
its other pods are still being made (or were never made, after a crash). Gated
pods exist first and run nowhere; only when every replica's pod exists is each
one ungated and bound (gitsched is the scheduler here: `schedulerName: gitsched`,
so no kube-scheduler takes a pod in between). The last pod a gang needs has no
other replica to wait for: when every other replica's pod exists (gated), it is
created with `nodeName`, one API call instead of three (create, ungate, bind),
which is most of what a pod costs us; then the others are ungated and bound. A
single-pod job's pod is such a last pod.

Throughput: API calls wait on the server, so jobs are converged by a bounded
pool of threads sharing one client (its connection pool is sized for them, see
cluster.api.POOL_SIZE); each job's own calls stay in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from gitsched.cluster.api import ClusterRefused, KubeApi, Obj
from gitsched.cluster.informer import Informer, Key
from gitsched.cluster.pods import JOB_ANNOTATION, PLACEMENT_LABEL, DesiredPod, desired_pods
from gitsched.engine.state import ClusterState
from gitsched.policies.pod_security import template_problems

log = logging.getLogger("gitsched.cluster")

TERMINAL = ("Succeeded", "Failed")

_T = TypeVar("_T")
_R = TypeVar("_R")


@dataclass
class ActuationReport:
    created: int = 0
    bound: int = 0
    deleted: int = 0
    # jobs whose every replica was bound in this pass (job -> PlacementDecided.at)
    gangs_bound: dict[str, str] = field(default_factory=dict)
    # job -> time.monotonic() when its last replica was bound (for latency figures)
    bound_at: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(self, other: ActuationReport) -> None:
        self.created += other.created
        self.bound += other.bound
        self.deleted += other.deleted
        self.gangs_bound.update(other.gangs_bound)
        self.bound_at.update(other.bound_at)
        self.errors.extend(other.errors)


def is_deleting(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def is_bound(pod: Obj) -> bool:
    return bool(pod.get("spec", {}).get("nodeName"))


class Actuator:
    def __init__(
        self,
        api: KubeApi,
        pods: Informer,
        *,
        grace_period_s: int = 30,
        create_namespaces: bool = False,
        workers: int = 24,
    ) -> None:
        self.api = api
        # Jobs are independent: their API calls overlap (each call waits on the server).
        self.workers = workers
        self.pods = pods
        self.grace_period_s = grace_period_s
        # Off by default: creating namespaces is a cluster-wide right the daemon should
        # not need; a platform team makes each team's namespace once.
        self.create_namespaces = create_namespaces
        self._namespaces: set[str] = set()
        self._refused: set[tuple[str, str]] = set()  # (job, placement) already logged

    def converge(self, state: ClusterState) -> ActuationReport:
        report = ActuationReport()
        desired = desired_pods(state)
        existing = self.pods.snapshot()
        unwanted = self._unwanted(state, desired, existing)
        by_job: dict[str, list[DesiredPod]] = {}
        for want in desired.values():
            by_job.setdefault(want.job, []).append(want)
        todo = [
            sorted(wants, key=lambda d: d.replica)
            for job, wants in sorted(by_job.items())
            if not _settled(wants, existing)
        ]
        # Deletions first: a preempted job's pods go before its successor's are made.
        self._each(unwanted, self._delete)
        report.deleted += len(unwanted)
        for part in self._each(todo, lambda w: self._converge_job(state, w, existing)):
            report.add(part)
        return report

    def _each(self, items: list[_T], fn: Callable[[_T], _R]) -> list[_R]:
        """fn on every item, up to `workers` at a time (API calls wait on the server)."""
        if len(items) <= 1 or self.workers <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(min(self.workers, len(items))) as pool:
            return list(pool.map(fn, items))

    def _unwanted(
        self,
        state: ClusterState,
        desired: dict[tuple[str, str], DesiredPod],
        existing: dict[Key, Obj],
    ) -> list[tuple[Key, Obj]]:
        out: list[tuple[Key, Obj]] = []
        # Only the pods of this repo's teams: another gitsched on the same cluster (another
        # repo, a test beside this one) makes its own, in its own teams' namespaces.
        ours = {q.team or name for name, q in state.queues.items()}
        ours.update(namespace for namespace, _ in desired)
        for key, pod in sorted(existing.items()):
            if is_deleting(pod) or key[0] not in ours:
                continue
            want = desired.get(key)
            labels = pod["metadata"].get("labels") or {}
            if want is not None and labels.get(PLACEMENT_LABEL) == want.placement:
                continue
            job = (pod["metadata"].get("annotations") or {}).get(JOB_ANNOTATION, "")
            phase = pod.get("status", {}).get("phase")
            if want is None and job in state.ended and phase in TERMINAL:
                continue  # a finished or failed job's pods stay, for their logs and exit codes
            # Preempted, withdrawn, moved, or the rest of a failed gang: delete, with a grace period.
            log.info("deleting pod %s/%s of %s", key[0], key[1], job or "?")
            out.append((key, pod))
        return out

    def _delete(self, item: tuple[Key, Obj]) -> None:
        (namespace, name), pod = item
        self.api.delete_pod(namespace, name, pod["metadata"]["uid"], self.grace_period_s)

    def _converge_job(
        self, state: ClusterState, wants: list[DesiredPod], existing: dict[Key, Obj]
    ) -> ActuationReport:
        report = ActuationReport()
        refusal = self._refusal(state, wants[0])
        if refusal:
            # The second wall: validation refuses such a template, but the log may hold a
            # job admitted before the rule, or under a policy since made stricter.
            report.errors.append(f"{wants[0].job}: {refusal}")
            return report
        try:
            self._converge_gang(state, wants, existing, report)
        except ClusterRefused as e:
            # One job's bad template must not stop every other job's pods.
            log.error("job %s: %s", wants[0].job, e)
            report.errors.append(f"{wants[0].job}: {e}")
        return report

    def _converge_gang(
        self,
        state: ClusterState,
        wants: list[DesiredPod],
        existing: dict[Key, Obj],
        report: ActuationReport,
    ) -> None:
        complete = True
        bound_now = 0
        pods: list[tuple[DesiredPod, Obj]] = []
        placement = state.placements.get(wants[0].job)
        started = placement is not None and state.started.get(wants[0].job) == placement.started_at
        for want in wants:
            key = (want.namespace, want.name)
            pod = existing.get(key)
            if pod is None and started:
                # The gang ran and lost a pod: not ours to quietly make again. The observer
                # logs JobInterrupted and the gang is placed again, whole.
                return
            if pod is None:
                self._ensure_namespace(want.namespace)
                # The last replica's pod, once every other one exists: nothing left to wait for.
                last = complete and len(pods) == len(wants) - 1
                pod = self.api.create_pod(want.namespace, _body_for(want, on_node=last))
                if pod is None:
                    # 409: it exists already (made before a crash, or by a twin): progress;
                    # the next pass sees it through the watch.
                    complete = False
                    continue
                self.pods.put(pod)
                report.created += 1
                if is_bound(pod):  # the last pod, made on its node
                    report.bound += 1
                    bound_now += 1
            elif (pod["metadata"].get("labels") or {}).get(PLACEMENT_LABEL) != want.placement:
                complete = False  # an old placement's pod still holds the name: wait until it goes
                continue
            pods.append((want, pod))
        if not complete:
            return
        # Every replica's pod exists: now, and only now, any of them is bound.
        for want, pod in pods:
            if is_bound(pod):
                continue
            if pod["spec"].get("schedulingGates"):
                self.api.remove_scheduling_gates(want.namespace, want.name)
            if self.api.bind(want.namespace, want.name, pod["metadata"]["uid"], want.node):
                report.bound += 1
                bound_now += 1
        if bound_now:
            placement = state.placements.get(wants[0].job)
            report.gangs_bound[wants[0].job] = placement.started_at if placement else ""
            report.bound_at[wants[0].job] = time.monotonic()

    def _refusal(self, state: ClusterState, want: DesiredPod) -> str:
        """Why no pod of this job may be made ("" when it may): what its template asks
        beyond its grant, judged by the policy in the log (policies/pod_security.py)."""
        job = state.jobs.get(want.job)
        if job is None:
            return ""
        rules = state.policy.pod_security
        problems = template_problems(
            job.template, job.resources, rules.level_of(want.namespace), rules.service_accounts
        )
        if not problems:
            return ""
        text = "; ".join(f"template.{'.'.join(map(str, p.path))}: {p.message}" for p in problems)
        refusal = f"no pod made: the pod template breaks the policy ({text})"
        if (want.job, want.placement) not in self._refused:
            self._refused.add((want.job, want.placement))
            log.error("job %s: %s", want.job, refusal)
        return refusal

    def _ensure_namespace(self, namespace: str) -> None:
        if self.create_namespaces and namespace not in self._namespaces:
            self.api.ensure_namespace(namespace)
            self._namespaces.add(namespace)


def _body_for(want: DesiredPod, *, on_node: bool) -> Obj:
    """A pod is made gated, or, when it is its gang's last (a single pod is its own), made
    bound on its node (see the module's docstring)."""
    if not on_node:
        return want.body
    spec = {k: v for k, v in want.body["spec"].items() if k != "schedulingGates"}
    spec["nodeName"] = want.node
    return {**want.body, "spec": spec}


def _settled(wants: list[DesiredPod], existing: dict[Key, Obj]) -> bool:
    """Every replica's pod exists for this placement and is bound: nothing to do."""
    for want in wants:
        pod = existing.get((want.namespace, want.name))
        if (
            pod is None
            or not is_bound(pod)
            or (pod["metadata"].get("labels") or {}).get(PLACEMENT_LABEL) != want.placement
        ):
            return False
    return True
