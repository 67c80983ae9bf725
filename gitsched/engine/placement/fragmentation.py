"""Node choice that keeps room for the work the cluster actually sees.

Best fit on free GPU packs well only when every job looks alike. Over a real workload
(the openb trace: shares of 50 to 950 milli-GPU beside whole-GPU pods, CPU-heavy pods
beside GPU-heavy ones) what matters is whether what a node has left is still usable by
the jobs that come. So the log keeps a bounded summary of the job shapes submitted
(engine.shapes, folded by engine.state on every JobSubmitted; this module only reads
it), the solver's instance carries it (`learned_shapes`), and a replica goes where the node's *workload
fragmentation* (FGD, USENIX ATC'23: milli-GPU the seen shapes could not use) plus its
*stranded GPU* (free GPU the node's free CPU and memory cannot feed at the workload's own
ratios) grows least, then best fit. `NodeScorer` is that rule; greedy.Packing asks it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gitsched.engine.placement.constraints import NodeFree
from gitsched.engine.placement.objective import WorkloadShape, stranded_gpu, workload_fragmentation
from gitsched.engine.placement.plan import PlacementInstance
from gitsched.engine.shapes import JobShape
from gitsched.engine.units import GPU_MILLI

# -- scoring nodes -----------------------------------------------------------------------------

# free GPU per GPU (sorted), CPU step, memory step: fragmentation depends on nothing else
FreeState = tuple[str | None, tuple[int, ...], int, int]


@dataclass(frozen=True, slots=True)
class Workload:
    """The learned shapes as FGD's measure reads them: each shape's share of the weight,
    with CPU and memory as steps among the shapes' distinct demands; and the workload's
    milli-GPU per milli-CPU and per MiB."""

    shapes: tuple[WorkloadShape, ...]
    cpu_steps: tuple[int, ...]
    memory_steps: tuple[int, ...]
    gpu_per_cpu: float
    gpu_per_memory: float

    @staticmethod
    def of(
        weighted: Sequence[tuple[JobShape, int]], flavors: Iterable[str | None]
    ) -> Workload | None:
        gpu_shapes = [(s, w) for s, w in weighted if s.gpu_milli > 0 and w > 0]
        if not gpu_shapes:
            return None
        every = frozenset(f for f in flavors if f is not None)
        total = sum(w for _, w in gpu_shapes)
        cpu_steps = tuple(sorted({s.cpu_milli for s, _ in gpu_shapes}))
        memory_steps = tuple(sorted({s.memory_mib for s, _ in gpu_shapes}))
        shapes = []
        for s, w in gpu_shapes:
            whole = s.gpu_milli >= GPU_MILLI
            shapes.append(
                (
                    w / total,
                    bisect.bisect_left(cpu_steps, s.cpu_milli),
                    bisect.bisect_left(memory_steps, s.memory_mib),
                    s.gpu_milli // GPU_MILLI if whole else 1,
                    GPU_MILLI if whole else s.gpu_milli,
                    frozenset(s.flavors) if s.flavors else every,
                )
            )
        gpu = sum(s.gpu_milli * w for s, w in gpu_shapes)
        cpu = sum(s.cpu_milli * w for s, w in gpu_shapes)
        memory = sum(s.memory_mib * w for s, w in gpu_shapes)
        return Workload(
            tuple(shapes), cpu_steps, memory_steps, gpu / max(cpu, 1), gpu / max(memory, 1)
        )


class NodeScorer:
    """How much placing a replica on a node grows its workload fragmentation plus its
    stranded GPU (both milli-GPU), and on which GPU a share should go to grow it least.
    Fragmentation is remembered per node state: many nodes are left alike."""

    def __init__(self, workload: Workload, gpu_bound: bool = True) -> None:
        self.workload = workload
        # Whether the cluster's CPU and memory could feed all its GPUs at the workload's
        # ratios. Where they cannot, CPU or memory runs out first whatever the choice:
        # every node ends with GPU it cannot feed, and counting that GPU only pushes CPU
        # around (measured on the openb variants asking 2.5x the CPU: 0.3-0.4 points lost).
        self.gpu_bound = gpu_bound
        self._fragmentation: dict[FreeState, float] = {}

    @staticmethod
    def of(instance: PlacementInstance) -> NodeScorer | None:
        """The instance's scorer; None where it carries no GPU shapes (best fit then)."""
        if not instance.shapes:
            return None
        workload = Workload.of(instance.shapes, (n.flavor for n in instance.nodes))
        if workload is None:
            return None
        nodes = [n for n in instance.nodes if n.schedulable]
        gpu = GPU_MILLI * sum(n.gpus for n in nodes)
        fed = min(
            sum(n.cpu_milli for n in nodes) * workload.gpu_per_cpu,
            sum(n.memory_mib for n in nodes) * workload.gpu_per_memory,
        )
        return NodeScorer(workload, gpu_bound=fed >= gpu)

    def fragmentation(
        self, flavor: str | None, gpus: tuple[int, ...], cpu: int, memory: int
    ) -> float:
        w = self.workload
        state = (
            flavor,
            gpus,
            bisect.bisect_right(w.cpu_steps, cpu),
            bisect.bisect_right(w.memory_steps, memory),
        )
        found = self._fragmentation.get(state)
        if found is None:
            if len(self._fragmentation) > 200_000:
                self._fragmentation.clear()
            found = workload_fragmentation(flavor, gpus, state[2], state[3], w.shapes)
            self._fragmentation[state] = found
        return found

    def stranded(self, gpu: int, cpu: int, memory: int) -> float:
        """The node's GPU its CPU and memory cannot feed, where GPU is what runs out."""
        if not self.gpu_bound:
            return 0.0
        w = self.workload
        return stranded_gpu(gpu, cpu, memory, w.gpu_per_cpu, w.gpu_per_memory)

    def growth(
        self, free: NodeFree, gpu_milli: int, cpu_milli: int, memory_mib: int
    ) -> tuple[float, int]:
        """(growth of fragmentation plus stranded GPU, the GPU for a share: -1 otherwise)
        for one replica on `free`, which must have room for it."""
        flavor = free.node.flavor
        before_gpus = tuple(sorted(free.gpu_free))
        cpu, memory = free.cpu_free, free.memory_free
        cpu_after, memory_after = cpu - cpu_milli, memory - memory_mib
        base = self.fragmentation(flavor, before_gpus, cpu, memory) + self.stranded(
            free.free_gpu_milli, cpu, memory
        )
        stranded_after = self.stranded(free.free_gpu_milli - gpu_milli, cpu_after, memory_after)
        if gpu_milli == 0 or gpu_milli >= GPU_MILLI:
            after = list(before_gpus)
            for _ in range(gpu_milli // GPU_MILLI):
                after.remove(GPU_MILLI)
                after.insert(0, 0)
            frag = self.fragmentation(flavor, tuple(sorted(after)), cpu_after, memory_after)
            return round(frag + stranded_after - base, 9), -1
        best: tuple[float, int, int] | None = None
        seen: set[int] = set()
        for g, left in enumerate(free.gpu_free):
            if left < gpu_milli or left in seen:
                continue
            seen.add(left)
            after = list(before_gpus)
            after.remove(left)
            bisect.insort(after, left - gpu_milli)
            frag = self.fragmentation(flavor, tuple(after), cpu_after, memory_after)
            # Ties go to the fullest GPU that takes the share (best fit), then the lowest.
            option = (round(frag + stranded_after - base, 9), left, g)
            if best is None or option < best:
                best = option
        assert best is not None, "the node has room for the share"
        return best[0], best[2]
