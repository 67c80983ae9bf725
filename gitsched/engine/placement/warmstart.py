"""The warm start: a plan (greedy's) as column values of the formulation, so the solver
starts from a plan it must beat and the placer can always fall back to it.
"""

from __future__ import annotations

from collections import defaultdict

from gitsched.engine.placement.formulation import Formulation, aux_value
from gitsched.engine.placement.plan import OutcomeStatus, PlacementInstance, PlacementPlan


def warm_values(
    formulation: Formulation, instance: PlacementInstance, plan: PlacementPlan
) -> list[float] | None:
    """The plan as column values of the model; None if the model cannot express it."""
    lp = formulation.lp
    x = [0.0] * lp.num_cols
    nodes = {n.name: n for n in instance.nodes}
    outcomes = {o.job: o for o in plan.outcomes}
    for key, jv in formulation.jobs.items():
        o = outcomes.get(key)
        if o is None or not o.running:
            continue
        if o.status is OutcomeStatus.KEPT:
            if jv.keep < 0:
                return None
            x[jv.keep] = 1.0
            continue
        if jv.place < 0 or o.flavor not in jv.flavor:
            return None
        x[jv.place] = 1.0
        x[jv.flavor[o.flavor]] = 1.0
        if jv.replicas >= 0:
            x[jv.replicas] = float(len(o.replicas))
        per_class: dict[int, int] = defaultdict(int)
        hosts: dict[int, set[str]] = defaultdict(set)
        for r in o.replicas:
            cid = formulation.node_class.get(r.node)
            if cid is None:
                return None
            per_class[cid] += 1
            hosts[cid].add(r.node)
        option = "loose"
        if jv.level is not None:
            domains = {nodes[r.node].domain(jv.level) for r in o.replicas}
            one_node = len({r.node for r in o.replicas}) == 1
            first = next(iter(per_class))
            slot = first if formulation.small else -1 - formulation.classes[first].coarse
            domain = next(iter(domains)) if len(domains) == 1 else None
            if domain is not None and (o.flavor, domain) in jv.domain:
                x[jv.domain[(o.flavor, domain)]] = 1.0
                option = "domain"
            elif one_node and slot in jv.single:
                x[jv.single[slot]] = 1.0
                if slot in jv.single_replicas:
                    x[jv.single_replicas[slot]] = float(len(o.replicas))
                option = "single"
            elif jv.spread >= 0:
                x[jv.spread] = 1.0
            else:
                return None
        if option == "loose":
            for cid, count in per_class.items():
                kid = formulation.classes[cid].coarse
                if kid in jv.per_coarse:
                    x[jv.per_coarse[kid]] += count
                elif cid in jv.per_class:
                    x[jv.per_class[cid]] += count
                else:
                    return None
        elif option == "domain":
            chosen = set(jv.domain.values())
            for cid, count in per_class.items():
                col = jv.per_class.get(cid)
                if col is None:
                    return None
                if col not in chosen:
                    x[col] += count
        for cid, held in hosts.items():
            kid = formulation.classes[cid].coarse
            if cid in jv.holds:
                x[jv.holds[cid]] += len(held)
            elif -1 - kid in jv.holds:
                x[jv.holds[-1 - kid]] += len(held)
    for col, terms, const, kind, param in formulation.aux:
        x[col] = aux_value(kind, terms, const, param, x, lp.col_lower[col])
    return x
