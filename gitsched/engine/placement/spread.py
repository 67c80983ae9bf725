"""Spread, the opposite of a gang: at most `maxPerDomain` replicas of one service in one
domain of a topology level, so losing a node, a rack or a zone takes at most that many.

One constraint, written here once: greedy asks `SpreadCount.blocks` before it puts a
replica on a node, the MILP adds one row per service, level and domain (`spread_rows`
in formulation.py reads `groups`), and check.py re-counts every plan with
`spread_violations`. A cap per domain rather than Kubernetes' maxSkew: it is one linear
row per domain in every solver, and it does not depend on which empty domains count.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from gitsched.engine.model import Job, Node, Spread

# (service, level, domain)
Cell = tuple[str, str, str]


def has_spread(job: Job) -> bool:
    return bool(job.service) and bool(job.spread)


def spread_levels(jobs: Iterable[Job]) -> frozenset[str]:
    """The levels some service spreads over ('node' included when one does)."""
    return frozenset(rule.level for j in jobs if has_spread(j) for rule in j.spread)


def cells(job: Job, node: Node) -> list[tuple[Cell, Spread]]:
    """The cells a replica of `job` on `node` counts in, with the rule of each."""
    return [((job.service, rule.level, node.domain(rule.level)), rule) for rule in job.spread]


def limit_text(service: str, rule: Spread, domain: str) -> str:
    return (
        f"service {service} spreads at most {rule.max_per_domain} replica(s) per"
        f" {rule.level} domain, and {domain} holds {rule.max_per_domain}"
    )


class SpreadCount:
    """Replicas of each service per domain, as a plan is built (greedy's bookkeeping)."""

    def __init__(self) -> None:
        self.count: dict[Cell, int] = defaultdict(int)

    def add(self, job: Job, node: Node, replicas: int = 1) -> None:
        for cell, _ in cells(job, node):
            self.count[cell] += replicas

    def blocks(self, job: Job, node: Node) -> str | None:
        """Why one more replica of `job` may not go on `node`; None when it may."""
        for cell, rule in cells(job, node):
            if self.count[cell] >= rule.max_per_domain:
                return limit_text(job.service, rule, cell[2])
        return None


def spread_violations(
    jobs: Mapping[str, Job], nodes: Mapping[str, Node], placed: Sequence[tuple[str, Sequence[str]]]
) -> list[str]:
    """Every domain a plan puts more of a service's replicas in than its spread allows.
    `placed`: (job key, the node of each replica) of every job the plan runs."""
    count: dict[Cell, int] = defaultdict(int)
    rules: dict[Cell, Spread] = {}
    for key, on in placed:
        job = jobs.get(key)
        if job is None or not has_spread(job):
            continue
        for name in on:
            node = nodes.get(name)
            if node is None:
                continue
            for cell, rule in cells(job, node):
                count[cell] += 1
                rules[cell] = rule
    return [
        f"service {cell[0]}: {n} replicas in {cell[1]} domain {cell[2]},"
        f" more than its spread's {rules[cell].max_per_domain}"
        for cell, n in sorted(count.items())
        if n > rules[cell].max_per_domain
    ]
