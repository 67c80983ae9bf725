"""Leader election on a coordination.k8s.io Lease, so two gitsched replicas never act twice.

As client-go's leaderelection does: the holder renews the Lease every `retry_period_s`
from a thread of its own (`start`), whatever the daemon's pass is doing, and counts
itself the leader only until `renew_deadline_s` after the start of its last successful
renewal; a standby takes the Lease only when it has seen the Lease unchanged for
`leaseDurationSeconds` by its own monotonic clock (no comparison of two machines'
clocks). renew_deadline_s < lease duration, so a holder that cannot renew stops acting
before anyone may take over. Every write names the resourceVersion it read, so two
replicas racing for an expired Lease cannot both win (one gets 409). The log's own
fencing (expected last seq) stays the last line of defence.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from gitsched.cluster.api import ClusterRefused, ClusterUnavailable, KubeApi, release

log = logging.getLogger("gitsched.cluster")

MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_s: int = 15,
        renew_deadline_s: float | None = None,
        retry_period_s: float | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        # client-go's defaults (15 s, 10 s, 2 s) in proportion.
        self.renew_deadline_s = renew_deadline_s or lease_duration_s * 2 / 3
        self.retry_period_s = retry_period_s or lease_duration_s / 5
        # A round that outlasts the renew deadline is lost anyway: its requests share that
        # bound, as client-go's round shares one context deadline (and a request without
        # a bound could hold a clean stop for good).
        self._round_ends = 0.0
        if not 0 < self.renew_deadline_s < lease_duration_s:
            raise ValueError("the renew deadline must be shorter than the lease")
        self.clock = clock  # only for the times written into the Lease, for people to read
        self.monotonic = monotonic
        self.reached_api = False  # the last round got an answer from the API server
        # This replica leads until then (monotonic): its last renewal's start + renew deadline.
        self._leads_until = 0.0
        # Another holder's Lease as last seen (its resourceVersion), and when it was first seen so.
        self._observed: tuple[str, float] | None = None
        self._lock = threading.Lock()  # one round at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self.monotonic() < self._leads_until

    def start(self, on_change: Callable[[bool], None] | None = None) -> None:
        """Acquire and renew from a thread, every retry period, until `stop`; `on_change`
        is told when this replica becomes or stops being the leader."""
        if self._thread is not None:
            return
        self._stop.clear()

        def loop() -> None:
            was = self.is_leader
            while not self._stop.is_set():
                self.try_acquire_or_renew()
                now = self.is_leader
                if now != was and on_change is not None:
                    on_change(now)
                was = now
                # Wake early enough to renew before the deadline runs out on its own.
                self._stop.wait(self.retry_period_s)

        self._thread = threading.Thread(target=loop, name="lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing (the Lease is kept until `release` or its expiry)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this replica holds the Lease after it."""
        with self._lock:
            started = self.monotonic()
            self._round_ends = started + self.renew_deadline_s
            try:
                won = self._round(started)
                self.reached_api = True
            except (ClusterUnavailable, ClusterRefused) as e:
                # A holder that cannot reach the API keeps leading until its deadline.
                log.warning("leader election: %s", e)
                self.reached_api = False
                return self.is_leader
            self._leads_until = started + self.renew_deadline_s if won else 0.0
            return won

    def release(self) -> None:
        """Give the Lease up on a clean stop, so a standby takes over at once."""
        self.stop()
        if not self.is_leader:
            return
        self._round_ends = self.monotonic() + self.renew_deadline_s
        try:
            lease = self._read()
            if lease is not None and lease["spec"].get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["leaseDurationSeconds"] = 1
                self._replace(lease)
        except (ClusterUnavailable, ClusterRefused, ApiException) as e:
            log.warning("leader election: could not release the lease: %s", e)
        self._leads_until = 0.0

    def _round(self, started: float) -> bool:
        now = self.clock()
        lease = self._read()
        if lease is None:
            return self._create(now)
        spec = lease.setdefault("spec", {})
        holder = spec.get("holderIdentity")
        if holder and holder != self.identity:
            # Expired when it has not changed for its duration, as this replica saw it: the
            # holder's renewTime is another machine's clock, and a renewal this replica
            # reads late (a busy machine) only makes it wait longer, never take early.
            version = str(lease.get("metadata", {}).get("resourceVersion") or json.dumps(spec))
            if self._observed is None or self._observed[0] != version:
                self._observed = (version, started)
            duration = int(spec.get("leaseDurationSeconds") or self.lease_duration_s)
            if started < self._observed[1] + duration:
                return False
            log.info("leader election: lease held by %s expired; taking it", holder)
        if holder != self.identity:
            spec["acquireTime"] = now.strftime(MICROTIME)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = self.lease_duration_s
        spec["renewTime"] = now.strftime(MICROTIME)
        return self._replace(lease)

    def _time_left(self) -> float:
        """A request's bound: what is left of the round's renew deadline (`release` is a
        round of its own)."""
        return max(0.1, self._round_ends - self.monotonic())

    def _read(self) -> dict[str, Any] | None:
        try:
            resp = self.api.coordination.read_namespaced_lease(
                self.name,
                self.namespace,
                _preload_content=False,
                _request_timeout=self._time_left(),
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise _error(e) from e
        except urllib3.exceptions.HTTPError as e:
            raise ClusterUnavailable(f"read lease: {e}") from e
        lease: dict[str, Any] = json.loads(resp.data)
        release(resp)
        return lease

    def _create(self, now: datetime) -> bool:
        stamp = now.strftime(MICROTIME)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_duration_s,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
        try:
            release(
                self.api.coordination.create_namespaced_lease(
                    self.namespace,
                    body,
                    _preload_content=False,
                    _request_timeout=self._time_left(),
                )
            )
        except ApiException as e:
            if e.status == 409:
                return False  # another replica made it first
            raise _error(e) from e
        except urllib3.exceptions.HTTPError as e:
            raise ClusterUnavailable(f"create lease: {e}") from e
        return True

    def _replace(self, lease: dict[str, Any]) -> bool:
        try:
            release(
                self.api.coordination.replace_namespaced_lease(
                    self.name,
                    self.namespace,
                    lease,
                    _preload_content=False,
                    _request_timeout=self._time_left(),
                )
            )
        except ApiException as e:
            if e.status == 409:
                return False  # someone wrote since we read: they won this round
            raise _error(e) from e
        except urllib3.exceptions.HTTPError as e:
            raise ClusterUnavailable(f"update lease: {e}") from e
        return True


def _error(e: ApiException) -> Exception:
    if (e.status or 0) >= 500 or not e.status:
        return ClusterUnavailable(f"lease: {e.status} {e.reason}")
    return ClusterRefused(f"lease: {e.status} {e.reason}")
