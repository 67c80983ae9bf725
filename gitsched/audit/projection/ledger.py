"""Usage accounting and the queue-limit check: a fold of its own inside the audit projection.

The `Projector` calls it through `Usage` (charges, quota changes, solves, violation
numbers), so a rebuild can run the ledger in its writer process (`gitsched.audit.writer`)
while the folding process goes on reading the log; `DeferredUsage` records the
calls for that.
"""

from __future__ import annotations

from typing import Protocol

from gitsched.audit.projection.rows import Batch
from gitsched.audit.projection.state import Account, Pool, ProjectionState
from gitsched.audit.projection.vocabulary import CHECK_LIMITS, DAY, compact_json
from gitsched.engine.units import gpus_text as gpus

# A queue in force, as the usage ledger sees it: team, cohort, quotas (flavor -> [nominal,
# borrowing limit, lending limit] in milli-GPU) and the seq of the event that configured it.
QuotaInfo = tuple[str, str | None, dict[str, list[int | None]], int]


class Usage(Protocol):
    """Where the fold sends what usage accounting needs: a `UsageLedger`, or a
    `DeferredUsage` that records it for a ledger in another process."""

    def charge(
        self, seq: int, ts: float, queue: str, flavor: str, milli: int, batch: Batch
    ) -> None: ...

    def requota(
        self, seq: int, ts: float, name: str, quota: QuotaInfo | None, batch: Batch
    ) -> None: ...

    def solve(self, seq: int, time: str, batch: Batch) -> None: ...

    def violation(
        self,
        check: str,
        seq: int,
        time: str,
        subject: str,
        message: str,
        evidence: str,
        batch: Batch,
    ) -> None: ...

    def snapshot_open(self, batch: Batch) -> None: ...


# What a `DeferredUsage` records, one tuple a call: the kind first.
_CHARGE, _REQUOTA, _SOLVE, _VIOLATION = range(4)


class UsageLedger:
    """Usage accounting and the queue-limit check, a fold of its own inside the projection.

    It needs of the log only charges (a placement started or ended), quota changes and
    solves, and it numbers every violation, so it sees them in order too. That is
    little to send for a large part of the fold's work (and of the rows: segments,
    daily sums, lending rates), so a rebuild runs it in its writer process. It owns
    the state's `accounts`, `pools`, `touched`, `over_limit`, `next_segment`,
    `next_violation` and the queue-limit count of `checked`.
    """

    def __init__(self, state: ProjectionState) -> None:
        self.state = state
        self._ts = 0.0
        self._queues: dict[str, QuotaInfo] = {
            name: (q.team, q.cohort, q.quotas, q.seq) for name, q in state.queues.items()
        }

    def replay(self, batch: Batch) -> None:
        """Apply the calls a `DeferredUsage` recorded in `batch`, in their order."""
        calls, batch.usage_calls = batch.usage_calls, []
        for call in calls:
            kind = call[0]
            if kind == _CHARGE:
                self.charge(call[1], call[2], call[3], call[4], call[5], batch)
            elif kind == _SOLVE:
                self.solve(call[1], call[2], batch)
            elif kind == _VIOLATION:
                self.violation(call[1], call[2], call[3], call[4], call[5], call[6], batch)
            else:
                self.requota(call[1], call[2], call[3], call[4], batch)

    def snapshot_open(self, batch: Batch) -> None:
        batch.open_segments = [a.row(None, None) for a in self.state.accounts.values()]

    # -- violations ------------------------------------------------------------------------

    def violation(
        self,
        check: str,
        seq: int,
        time: str,
        subject: str,
        message: str,
        evidence: str,
        batch: Batch,
    ) -> None:
        """A violation found by the fold: it takes the next id (`evidence`: its JSON)."""
        self._violation(check, seq, time, subject, message, evidence, batch)

    def _violation(
        self,
        check: str,
        seq: int,
        time: str,
        subject: str,
        message: str,
        evidence: str,
        batch: Batch,
    ) -> int:
        s = self.state
        vid = s.next_violation
        s.next_violation += 1
        batch.violations.append((vid, check, seq, time, subject, message, evidence))
        return vid

    # -- accounts, segments and pools ------------------------------------------------------

    def _pool(self, cohort: str, flavor: str) -> Pool:
        key = f"{cohort}\x1f{flavor}"
        pool = self.state.pools.get(key)
        if pool is None:
            pool = self.state.pools[key] = Pool(ts=self._ts)
        elif pool.ts != self._ts:
            first, last = int(pool.ts // DAY) + 1, int(self._ts // DAY)
            for day in range(first, last + 1):
                pool.days[str(day)] = pool.r + pool.rate * (day * DAY - pool.ts)
            pool.r += pool.rate * (self._ts - pool.ts)
            pool.ts = self._ts
        return pool

    def _account(self, queue: str, flavor: str, batch: Batch) -> Account:
        key = f"{queue}\x1f{flavor}"
        acc = self.state.accounts.get(key)
        if acc is not None:
            return acc
        info = self._queues.get(queue)
        # Born empty (no use, no quota: nothing to add to a pool), then given its quota.
        acc = Account(
            queue=queue,
            flavor=flavor,
            team=info[0] if info else queue,
            cohort=info[1] if info else None,
            used=0,
            nominal=0,
            borrowing_limit=None,
            lending_limit=None,
            segment=0,
            from_ts=self._ts,
            r_from=0.0,
        )
        self.state.accounts[key] = acc
        self._open_segment(acc)
        quota = info[2].get(flavor) if info else None
        if quota is not None:
            self._reaccount(
                acc, batch, 0, (quota[0] or 0, quota[1], quota[2]), acc.cohort, acc.team
            )
        return acc

    def _open_segment(self, acc: Account) -> None:
        s = self.state
        acc.segment = s.next_segment
        s.next_segment += 1
        acc.from_ts = self._ts
        acc.r_from = self._pool(acc.cohort, acc.flavor).r if acc.cohort else 0.0

    def _close_segment(self, acc: Account, r_to: float, batch: Batch) -> None:
        """Write the account's segment as it stood, and open the next one now."""
        self._end_segment(acc, r_to, batch)
        self._open_segment(acc)

    def _end_segment(self, acc: Account, r_to: float, batch: Batch) -> None:
        """The segment's row, and its part of each UTC day's sums (integer milli-GPU-
        microseconds, so they do not depend on the order they were added in)."""
        start, end = acc.from_ts, self._ts
        used, nominal, r_from = acc.used, acc.nominal, acc.r_from
        unused = nominal - used
        limit = acc.lending_limit
        lendable = 0 if unused <= 0 else (unused if limit is None or unused < limit else limit)
        queue, team, flavor = acc.queue, acc.team, acc.flavor
        lent = lendable * (r_to - r_from)
        batch.segments.append(
            (
                acc.segment,
                queue,
                team,
                acc.cohort,
                flavor,
                start,
                end,
                used,
                nominal,
                lendable,
                r_from,
                r_to,
                lent,
            )
        )
        if end <= start:
            return
        borrowed = -unused if unused < 0 else 0
        idle = unused if unused > 0 else 0
        days = batch.usage_days
        first, last = int(start // DAY), int(end // DAY)
        if end == last * DAY:
            last -= 1  # a segment that ends at 00:00:00 has no part of the day it ends on
        if first == last:
            # Within one day: the common case.
            micros = round((end - start) * 1e6)
            key = (queue, team, flavor, first)
            sums = days.get(key)
            if sums is None:
                days[key] = [
                    used * micros,
                    nominal * micros,
                    borrowed * micros,
                    idle * micros,
                    round(lent * 1e6),
                ]
            else:
                sums[0] += used * micros
                sums[1] += nominal * micros
                sums[2] += borrowed * micros
                sums[3] += idle * micros
                if lendable:
                    sums[4] += round(lent * 1e6)
            return
        boundaries = self.state.pools[f"{acc.cohort}\x1f{flavor}"].days if acc.cohort else {}
        r_low = r_from
        for day in range(first, last + 1):
            low, high = max(start, day * DAY), min(end, (day + 1) * DAY)
            if high <= low:
                continue
            micros = round((high - low) * 1e6)
            r_high = r_to if high == end else boundaries.get(str(day + 1), r_to)
            key = (queue, team, flavor, day)
            sums = days.get(key)
            if sums is None:
                sums = days[key] = [0, 0, 0, 0, 0]
            sums[0] += used * micros
            sums[1] += nominal * micros
            sums[2] += borrowed * micros
            sums[3] += idle * micros
            if lendable:
                sums[4] += round(lendable * (r_high - r_low) * 1e6)
            r_low = r_high

    def _reaccount(
        self,
        acc: Account,
        batch: Batch,
        used: int,
        quota: tuple[int, int | None, int | None],
        cohort: str | None,
        team: str,
    ) -> None:
        """Give the account new use, quota or cohort: a new segment, new pool sums."""
        old_pool = self._pool(acc.cohort, acc.flavor) if acc.cohort else None
        old_cohort, old_team = acc.cohort, acc.team
        b0, l0 = acc.borrowed, acc.lendable
        if acc.from_ts != self._ts or (cohort, team) != (old_cohort, old_team):
            # Several changes at one instant (one solve) make one segment, not empty ones.
            self._close_segment(acc, old_pool.r if old_pool else 0.0, batch)
        acc.used = used
        acc.nominal, acc.borrowing_limit, acc.lending_limit = quota
        acc.cohort, acc.team = cohort, team
        if acc.cohort != old_cohort:
            acc.r_from = self._pool(acc.cohort, acc.flavor).r if acc.cohort else 0.0
        if old_pool is not None and old_cohort is not None:
            old_pool.borrowed -= b0
            old_pool.lendable -= l0
            self._rerate(old_cohort, acc.flavor, old_pool, batch)
        if acc.cohort is not None:
            pool = self._pool(acc.cohort, acc.flavor)
            pool.borrowed += acc.borrowed
            pool.lendable += acc.lendable
            self._rerate(acc.cohort, acc.flavor, pool, batch)

    def _rerate(self, cohort: str, flavor: str, pool: Pool, batch: Batch) -> None:
        rate = min(pool.borrowed, pool.lendable) / pool.lendable if pool.lendable > 0 else 0.0
        if rate != pool.rate:
            pool.rate = rate
            batch.rates.append((cohort, flavor, self._ts, pool.r, rate))

    def charge(
        self, seq: int, ts: float, queue: str, flavor: str, milli: int, batch: Batch
    ) -> None:
        """A placement started or ended: only the account's use moves (the hot path)."""
        self._ts = ts
        s = self.state
        key = f"{queue}\x1f{flavor}"
        acc = s.accounts.get(key) or self._account(queue, flavor, batch)
        seqs = s.touched.get(key)
        if seqs is None:
            s.touched[key] = [seq]
        else:
            seqs.append(seq)
        nominal = acc.nominal
        before = acc.used
        cohort = acc.cohort
        if cohort is None:
            if acc.from_ts != ts:
                self._close_segment(acc, 0.0, batch)
            acc.used = before + milli
            return
        pool = s.pools.get(f"{cohort}\x1f{flavor}")
        if pool is None:
            pool = self._pool(cohort, flavor)
        elif pool.ts != ts:
            if int(pool.ts // DAY) == int(ts // DAY):
                # _pool, inlined for the common case: no day boundary to record
                pool.r += pool.rate * (ts - pool.ts)
                pool.ts = ts
            else:
                pool = self._pool(cohort, flavor)
        if acc.from_ts != ts:
            # _close_segment, inlined: this runs for every placement that starts or ends.
            r = pool.r
            self._end_segment(acc, r, batch)
            acc.segment = s.next_segment
            s.next_segment += 1
            acc.from_ts = ts
            acc.r_from = r
        after = acc.used = before + milli
        limit = acc.lending_limit
        unused0, unused1 = nominal - before, nominal - after
        l0 = 0 if unused0 <= 0 else (unused0 if limit is None or unused0 < limit else limit)
        l1 = 0 if unused1 <= 0 else (unused1 if limit is None or unused1 < limit else limit)
        over0, over1 = before - nominal, after - nominal
        borrowed = pool.borrowed = (
            pool.borrowed + (over1 if over1 > 0 else 0) - (over0 if over0 > 0 else 0)
        )
        lendable = pool.lendable = pool.lendable + l1 - l0
        rate = (borrowed if borrowed < lendable else lendable) / lendable if lendable > 0 else 0.0
        if rate != pool.rate:
            pool.rate = rate
            batch.rates.append((cohort, flavor, ts, pool.r, rate))

    def requota(
        self, seq: int, ts: float, name: str, quota: QuotaInfo | None, batch: Batch
    ) -> None:
        """Quotas in force changed: every account of the queue takes the new limits and cohort."""
        self._ts = ts
        s = self.state
        if quota is None:
            self._queues.pop(name, None)
        else:
            self._queues[name] = quota
        flavors = set(quota[2]) if quota else set()
        flavors |= {a.flavor for a in s.accounts.values() if a.queue == name}
        for flavor in sorted(flavors):
            acc = self._account(name, flavor, batch)
            limit = quota[2].get(flavor) if quota else None
            limits = (limit[0] or 0, limit[1], limit[2]) if limit else (0, None, None)
            cohort = quota[1] if quota else None
            self._reaccount(acc, batch, acc.used, limits, cohort, quota[0] if quota else acc.team)
            s.touched.setdefault(f"{name}\x1f{flavor}", []).append(seq)

    # -- queue limits ------------------------------------------------------------------------

    def solve(self, seq: int, time: str, batch: Batch) -> None:
        """A solve's events are one atomic append: limits are checked where it ends."""
        s = self.state
        if not s.touched:
            return
        touched, s.touched = s.touched, {}
        s.checked[CHECK_LIMITS] += 1
        accounts, over_limit = s.accounts, s.over_limit
        cohorts: dict[str, list[int]] = {}
        turned: list[str] = []
        # Most solves start and end no episode: find those that do, then go through them in
        # order (violation ids follow it).
        for key, seqs in touched.items():
            acc = accounts.get(key)
            if acc is None:
                continue
            ceiling: int | None
            if acc.cohort is None:
                ceiling = acc.nominal
            else:
                pool_key = f"{acc.cohort}\x1f{acc.flavor}"
                merged = cohorts.get(pool_key)
                if merged is None:
                    cohorts[pool_key] = list(seqs)
                else:
                    merged.extend(seqs)
                limit = acc.borrowing_limit
                ceiling = None if limit is None else acc.nominal + limit
            over = ceiling is not None and acc.used > ceiling
            if over != (bool(over_limit) and f"queue\x1f{key}" in over_limit):
                turned.append(key)
        for key in sorted(turned):
            acc = accounts[key]
            limit = acc.borrowing_limit
            if acc.cohort is None:
                ceiling = acc.nominal
            else:
                ceiling = None if limit is None else acc.nominal + limit
            over = ceiling is not None and acc.used > ceiling
            what = ""
            if over:
                what = (
                    f"queue {acc.queue} uses {gpus(acc.used)} {acc.flavor} GPUs; "
                    f"its limit is {gpus(ceiling or 0)}"
                    + (
                        f" (nominal {gpus(acc.nominal)} + borrowing limit {gpus(limit)})"
                        if acc.cohort is not None and limit is not None
                        else " (nominal, no cohort to borrow from)"
                    )
                )
            queue = self._queues.get(acc.queue)
            evidence = touched[key] + ([queue[3]] if queue else [])
            self._limit_episode(
                f"queue\x1f{key}", over, acc.queue, what, evidence, seq, time, batch
            )
        pools = s.pools
        for key in sorted(cohorts):
            pool = pools.get(key)
            if pool is None:
                continue
            over = pool.borrowed > pool.lendable
            if over == (bool(over_limit) and f"cohort\x1f{key}" in over_limit):
                continue
            cohort, flavor = key.split("\x1f")
            what = (
                f"cohort {cohort} borrows {gpus(pool.borrowed)} {flavor} GPUs but its members "
                f"can lend only {gpus(pool.lendable)}"
            )
            self._limit_episode(
                f"cohort\x1f{key}", over, cohort, what, cohorts[key], seq, time, batch
            )

    def _limit_episode(
        self,
        key: str,
        over: bool,
        subject: str,
        message: str,
        evidence: list[int],
        seq: int,
        time: str,
        batch: Batch,
    ) -> None:
        s = self.state
        open_id = s.over_limit.get(key)
        if over and open_id is None:
            s.over_limit[key] = self._violation(
                CHECK_LIMITS,
                seq,
                time,
                subject,
                message,
                compact_json(sorted({*evidence, seq})),
                batch,
            )
        elif not over and open_id is not None:
            del s.over_limit[key]
            batch.violation_close.append((seq, time, open_id))


class DeferredUsage:
    """A `Usage` that records each call in the batch (`usage_calls`) for a `UsageLedger` in
    the rebuild's writer process to replay; the rows it would make are made there."""

    def __init__(self) -> None:
        # Whether anything was charged or requoted since the last solve: one that follows
        # nothing checks nothing, and need not be sent.
        self._touched = True

    def charge(
        self, seq: int, ts: float, queue: str, flavor: str, milli: int, batch: Batch
    ) -> None:
        self._touched = True
        batch.usage_calls.append((_CHARGE, seq, ts, queue, flavor, milli))

    def requota(
        self, seq: int, ts: float, name: str, quota: QuotaInfo | None, batch: Batch
    ) -> None:
        self._touched = True
        batch.usage_calls.append((_REQUOTA, seq, ts, name, quota))

    def solve(self, seq: int, time: str, batch: Batch) -> None:
        if self._touched:
            self._touched = False
            batch.usage_calls.append((_SOLVE, seq, time))

    def violation(
        self,
        check: str,
        seq: int,
        time: str,
        subject: str,
        message: str,
        evidence: str,
        batch: Batch,
    ) -> None:
        batch.usage_calls.append((_VIOLATION, check, seq, time, subject, message, evidence))

    def snapshot_open(self, batch: Batch) -> None:
        pass  # the ledger's process writes the open segments
