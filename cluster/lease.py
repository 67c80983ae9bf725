"""Leader election on a coordination.k8s.io Lease, so two gitsched replicas never act twice.

The holder renews the Lease every pass; another replica takes it only after
`leaseDurationSeconds` without a renewal. Every write names the resourceVersion
it read, so two replicas racing for an expired Lease cannot both win (one gets
409). The log's own fencing (expected last seq) stays the last line of defence.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from cluster.api import ClusterRefused, ClusterUnavailable, KubeApi, release

log = logging.getLogger("gitsched.cluster")

MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    for fmt in (MICROTIME, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration_s: int = 15,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.clock = clock
        self.is_leader = False
        self.reached_api = False  # the last round got an answer from the API server

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this replica holds the Lease after it."""
        try:
            self.is_leader = self._round()
            self.reached_api = True
        except (ClusterUnavailable, ClusterRefused) as e:
            log.warning("leader election: %s", e)
            self.is_leader = self.reached_api = False
        return self.is_leader

    def release(self) -> None:
        """Give the Lease up on a clean stop, so a standby takes over at once."""
        if not self.is_leader:
            return
        try:
            lease = self._read()
            if lease is not None and lease["spec"].get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["leaseDurationSeconds"] = 1
                self._replace(lease)
        except (ClusterUnavailable, ClusterRefused, ApiException) as e:
            log.warning("leader election: could not release the lease: %s", e)
        self.is_leader = False

    def _round(self) -> bool:
        now = self.clock()
        lease = self._read()
        if lease is None:
            return self._create(now)
        spec = lease.setdefault("spec", {})
        holder = spec.get("holderIdentity")
        if holder and holder != self.identity:
            renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
            duration = int(spec.get("leaseDurationSeconds") or self.lease_duration_s)
            if renewed is not None and now < renewed + timedelta(seconds=duration):
                return False
            log.info("leader election: lease held by %s expired; taking it", holder)
        if holder != self.identity:
            spec["acquireTime"] = now.strftime(MICROTIME)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = self.lease_duration_s
        spec["renewTime"] = now.strftime(MICROTIME)
        return self._replace(lease)

    def _read(self) -> dict[str, Any] | None:
        try:
            resp = self.api.coordination.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False
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
                    self.namespace, body, _preload_content=False
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
                    self.name, self.namespace, lease, _preload_content=False
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
