"""The log's summary of the job shapes submitted, which the fold keeps on every JobSubmitted.

It belongs to the core, not to placement: the folded state (engine.state) carries it, and a
fold must not depend on the solver's packages. engine.placement.fragmentation only reads the
published summary (`learned_shapes`) to score nodes. Deterministic on replay: windows and
decay count submissions, never the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from immutables import Map

from gitsched.engine.model import Job

# The summary: at most SHAPE_LIMIT shapes, weights in SHAPE_UNIT per replica submitted.
# Submissions are counted in windows of SHAPE_WINDOW_JOBS; when one closes its counts are
# added to the published summary, which first loses SHAPE_DECAY_EIGHTHS/8 of its weight
# (a half-life of about five windows). The solver reads only the published summary, so it
# changes once a window, the same on every replay.
SHAPE_LIMIT = 64
SHAPE_WINDOW_JOBS = 128
SHAPE_DECAY_EIGHTHS = 1
SHAPE_UNIT = 1000


@dataclass(frozen=True, slots=True, order=True)
class JobShape:
    """What one replica of a job asks for, as the workload's history counts it: milli-GPU
    (whole GPUs as multiples of 1000, or a share of one), CPU, memory, and the GPU flavors
    it may run on (empty: any). engine.placement.fragmentation scores nodes over these."""

    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    flavors: tuple[str, ...] = ()


def shape_key(shape: JobShape) -> str:
    """The summary's key for a shape (a string: the folded state's maps are keyed by text)."""
    return f"{shape.gpu_milli}/{shape.cpu_milli}/{shape.memory_mib}/{','.join(shape.flavors)}"


def parse_shape(key: str) -> JobShape:
    gpu, cpu, memory, flavors = key.split("/", 3)
    return JobShape(int(gpu), int(cpu), int(memory), tuple(f for f in flavors.split(",") if f))


def job_shape(job: Job) -> JobShape:
    r = job.resources
    return JobShape(r.gpu_milli, r.cpu_milli, r.memory_mib, tuple(sorted(job.gpu_flavors)))


ShapeCounts = tuple[Map[str, int], Map[str, int], int]  # published, this window, its jobs


def remember_shape(counts: ShapeCounts, job: Job) -> ShapeCounts:
    """The state's summary of submitted shapes after `job` was submitted: (published, the
    window's counts not yet published, the jobs in the window). CPU-only jobs take no GPU:
    they are not counted (fragmentation is measured in GPU)."""
    published, window, jobs = counts
    if job.resources.gpu_milli <= 0:
        return counts
    key = shape_key(job_shape(job))
    window = window.set(key, window.get(key, 0) + SHAPE_UNIT * job.replicas)
    if jobs + 1 < SHAPE_WINDOW_JOBS:
        return published, window, jobs + 1
    return _publish(published, window), Map(), 0


def _publish(published: Map[str, int], window: Map[str, int]) -> Map[str, int]:
    merged: dict[str, int] = {}
    for key, weight in published.items():
        kept = weight - weight * SHAPE_DECAY_EIGHTHS // 8
        if kept > 0:
            merged[key] = kept
    for key, weight in window.items():
        merged[key] = merged.get(key, 0) + weight
    # The heaviest shapes, ties by key: bounded and independent of any map's order.
    kept_keys = sorted(merged, key=lambda k: (-merged[k], k))[:SHAPE_LIMIT]
    return Map({k: merged[k] for k in sorted(kept_keys)})


def learned_shapes(published: Map[str, int]) -> tuple[tuple[JobShape, int], ...]:
    """The published summary as the solver's instance carries it, in key order."""
    return tuple((parse_shape(k), published[k]) for k in sorted(published))
