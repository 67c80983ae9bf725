"""Leader election's timing, on one shared clock: a holder counts itself the leader only
until its renew deadline, a standby takes over only after seeing the Lease unchanged for
its whole duration, so two replicas never lead at once, however late either one runs
(issue 31 item 8: a leader whose pass outlasted the Lease was deposed while acting)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gitsched.cluster.lease import LeaderElector


@dataclass
class _Reply:
    data: bytes

    def drain_conn(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class _Leases:
    """The API server's Lease store, as far as the elector uses it: optimistic concurrency
    on metadata.resourceVersion (a write naming an old version gets 409)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.writes = 0

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> _Reply:
        if self.lease is None:
            raise ApiException(status=404, reason="Not Found")
        return _Reply(json.dumps(self.lease).encode())

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> _Reply:
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store(body)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> _Reply:
        assert self.lease is not None
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return self._store(body)

    def _store(self, body: dict[str, Any]) -> _Reply:
        self.version += 1
        self.writes += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return _Reply(json.dumps(self.lease).encode())


class _Api:
    def __init__(self) -> None:
        self.coordination = _Leases()


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return datetime(2026, 11, 28, tzinfo=UTC) + timedelta(seconds=self.t)


def _pair(wall_skew_s: float = 0.0) -> tuple[_Clock, LeaderElector, LeaderElector]:
    api, clock = _Api(), _Clock()

    def electors(name: str, skew: float) -> LeaderElector:
        return LeaderElector(
            api,  # type: ignore[arg-type]
            "default",
            "gitsched",
            name,
            lease_duration_s=15,
            clock=lambda: clock.wall() + timedelta(seconds=skew),
            monotonic=clock.monotonic,
        )

    return clock, electors("a", 0.0), electors("b", wall_skew_s)


def test_a_holder_that_renews_keeps_the_lease_however_long_its_passes() -> None:
    clock, a, b = _pair()
    assert a.try_acquire_or_renew() and a.is_leader
    for _ in range(20):  # a minute of renewals every 3 s: b never takes over
        clock.t += 3
        assert not b.try_acquire_or_renew()
        assert a.try_acquire_or_renew()
        assert a.is_leader and not b.is_leader


def test_a_holder_that_stops_renewing_stops_leading_before_anyone_takes_over() -> None:
    clock, a, b = _pair()
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b sees the Lease at t0
    # a renews no more (its pass hangs, its API calls fail): it leads 10 s, b takes at 15 s.
    timeline = []
    for _ in range(40):
        clock.t += 0.5
        b.try_acquire_or_renew()
        assert not (a.is_leader and b.is_leader), f"both lead at t={clock.t}"
        timeline.append((a.is_leader, b.is_leader))
    assert timeline[0] == (True, False) and timeline[-1] == (False, True)
    assert clock.monotonic() - 1000.0 == pytest.approx(20.0)
    # a, back, finds b holding the Lease and does not take it back.
    assert not a.try_acquire_or_renew()


def test_a_standby_judges_expiry_by_its_own_clock_not_the_holders() -> None:
    # b's wall clock runs an hour ahead: by renewTime the Lease looks long expired, but
    # b has seen it change lately, so it waits.
    clock, a, b = _pair(wall_skew_s=3600.0)
    assert a.try_acquire_or_renew()
    clock.t += 1
    assert not b.try_acquire_or_renew()
    clock.t += 5
    assert a.try_acquire_or_renew()
    clock.t += 5
    assert not b.try_acquire_or_renew()
    assert a.is_leader and not b.is_leader


def test_a_released_lease_is_taken_at_once() -> None:
    clock, a, b = _pair()
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader
    clock.t += 0.1
    assert b.try_acquire_or_renew() and b.is_leader


def test_the_renew_deadline_is_shorter_than_the_lease() -> None:
    with pytest.raises(ValueError):
        LeaderElector(_Api(), "default", "gitsched", "a", lease_duration_s=5, renew_deadline_s=5)  # type: ignore[arg-type]
