"""What a running job that may stay blocks, exactly. A kept replica holds particular GPUs
of a particular node, so the slots it takes from new replicas (whole-GPU slots of s GPUs,
share slots of q milli) depend on which other jobs on that node stay too; these rows count
them per set of keeps, so that fixing some jobs' columns keeps the formulation feasible.
The formulation's builder notes each keep here as it adds the running jobs, and asks for
the rows of each class it emits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

from gitsched.engine.model import ReplicaPlacement
from gitsched.engine.placement.classes import ClassRows, NodeClass, Terms, share_sizes
from gitsched.engine.placement.constraints import NodeFree
from gitsched.engine.placement.linear import LinearModel
from gitsched.engine.units import GPU_MILLI, gpus_from_milli


class KeptBlocking:
    """The keep columns on each node and GPU, and the columns and rows of what they block."""

    def __init__(
        self,
        lp: LinearModel,
        aux: list[tuple[int, Terms, float, str, float]],
        residual: Mapping[str, NodeFree],
    ) -> None:
        self.lp = lp
        self.aux = aux
        self.residual = residual  # what each node has left after the jobs that stay put
        self.on_node: dict[str, Terms] = defaultdict(list)  # kept whole GPUs per node
        self.jobs_on_node: dict[str, set[int]] = defaultdict(set)  # keep columns per node
        self.share_milli: dict[tuple[str, int], Terms] = defaultdict(list)  # per GPU
        self.shares: dict[tuple[str, int], Terms] = defaultdict(list)  # kept shares per GPU
        self.gpus_on_node: dict[str, tuple[Terms, dict[int, set[object]]]] = {}
        self.union: dict[str, dict[tuple[int, ...], int]] = {}  # GPUs a set of keeps takes
        self.share_slot_cols: dict[tuple[str, int, int], int] = {}
        self.share_cols: dict[tuple[str, int], int] = {}
        self.slot_cols: dict[tuple[str, int], int] = {}

    def blocked_gpus(self, replica: ReplicaPlacement) -> float:
        """GPUs of a kept replica that would otherwise be whole and free (shares: their part)."""
        free = self.residual.get(replica.node)
        if free is None:
            return 0.0
        whole = [
            g for g in replica.gpus if 0 <= g < len(free.gpu_free) and free.gpu_free[g] == GPU_MILLI
        ]
        return gpus_from_milli(len(whole) * replica.gpu_milli)

    def _share_col(self, node: str, g: int) -> int:
        """1 when some kept share sits on GPU g of `node` (a GPU that is otherwise whole)."""
        col = self.share_cols.get((node, g))
        if col is None:
            keeps = self.shares[(node, g)]
            if len({c for c, _ in keeps}) == 1:
                # One job's shares: the GPU is taken exactly when that job stays.
                self.share_cols[(node, g)] = keeps[0][0]
                return keeps[0][0]
            col = self.lp.var(f"shared_gpu__{node}__{g}", 0, 1)
            for c, _ in keeps:
                self.lp.row(f"shared_gpu__{node}__{g}", [(col, 1.0), (c, -1.0)], lower=0)
            self.aux.append((col, keeps, 0.0, "max", 0.0))
            self.share_cols[(node, g)] = col
        return col

    def _gpu_terms(self, node: str) -> tuple[Terms, dict[int, set[object]]]:
        """Whole GPUs that kept movable jobs take on `node`: their whole GPUs, and each
        otherwise whole GPU that a kept share sits on; and, per keep column, those GPUs."""
        found = self.gpus_on_node.get(node)
        if found is None:
            terms = list(self.on_node.get(node, ()))
            own: dict[int, set[object]] = defaultdict(set)
            for c, v in terms:
                own[c].update((c, i) for i in range(round(v)))
            free = self.residual.get(node)
            for g in range(len(free.gpu_free) if free is not None else 0):
                keeps = self.shares.get((node, g))
                if keeps:
                    terms.append((self._share_col(node, g), 1.0))
                    for c, _ in keeps:
                        own[c].add(g)
            found = self.gpus_on_node[node] = (terms, own)
        return found

    def _exact_blocking(
        self, name: str, col: int, keeps: list[int], blocked: Callable[[list[int]], int]
    ) -> None:
        """col >= blocked(S) whenever every keep of S stays, for the sets S of kept jobs on one
        node (all of them up to four jobs; else each job, each pair and all): with the keeps
        integral, col is then exactly what they block, so fixing jobs keeps the rows feasible."""
        n = len(keeps)
        if n <= 4:
            masks = list(range(1, 1 << n))
        else:
            masks = [1 << i for i in range(n)]
            masks += [1 << i | 1 << j for i in range(n) for j in range(i + 1, n)]
            masks.append((1 << n) - 1)
        value: dict[int, int] = {}

        def of(mask: int) -> int:
            if mask not in value:
                value[mask] = blocked([k for i, k in enumerate(keeps) if mask >> i & 1])
            return value[mask]

        for mask in masks:
            b = of(mask)
            bits = [1 << i for i in range(n) if mask >> i & 1]
            if b <= 0 or (len(bits) > 1 and any(of(mask ^ bit) >= b for bit in bits)):
                continue  # a smaller set's row is as strong
            self.lp.row(
                f"{name}_by",
                [(col, 1.0), *((k, -float(b)) for i, k in enumerate(keeps) if mask >> i & 1)],
                lower=-float(b) * (len(bits) - 1),
            )

    def share_gpu_rows(self, cls: NodeClass, rows: ClassRows) -> None:
        """Whole GPUs a kept share occupies count against the class's whole GPUs."""
        if not rows.whole:
            return
        for node in cls.nodes:
            for g in range(node.gpus):
                if self.shares.get((node.name, g)):
                    rows.whole.append((self._share_col(node.name, g), 1.0))

    def slot_rows(self, cls: NodeClass, rows: ClassRows) -> None:
        """Slots of s GPUs that kept movable jobs block on a node with W whole free GPUs:
        floor(W / s) - floor((W - k) / s) = ceil((k - W mod s) / s) for k kept GPUs; and
        at least what each kept job blocks on its own (the rows that keep the LP tight)."""
        sizes = [s for s in rows.items if s <= cls.node_gpus]
        for node in cls.nodes:
            if not self.jobs_on_node.get(node.name) or not self._gpu_terms(node.name)[0]:
                continue
            whole = self.residual[node.name].whole_free_gpus
            own = self._gpu_terms(node.name)[1]
            for size in sizes:
                if len(own) == 1:
                    # One kept job: it blocks exactly its own slots, when it stays.
                    ((keep, gpus),) = own.items()
                    blocked = whole // size - max(0, whole - len(gpus)) // size
                    if blocked:
                        rows.slot_use[size].append((keep, float(blocked)))
                    continue
                col = self.slot_cols.get((node.name, size))
                if col is None:
                    col = self._blocked_col(node.name, whole, size)
                rows.slot_use[size].append((col, 1.0))

    def share_slot_rows(self, cls: NodeClass, rows: ClassRows) -> None:
        """Slots of q milli that kept shares block on GPU g with f milli free:
        floor(f / q) - floor((f - kept) / q); at least what each kept share blocks alone."""
        sizes = share_sizes(rows)
        if not sizes:
            return
        for node in cls.nodes:
            if not self.jobs_on_node.get(node.name):
                continue
            free = self.residual[node.name].gpu_free
            for g, f in enumerate(free):
                keeps = self.share_milli.get((node.name, g))
                if not keeps:
                    continue
                for q in sizes:
                    col = self.share_slot_cols.get((node.name, g, q))
                    if col is None:
                        col = self.lp.var(f"blocked_slots__{node.name}__{g}__{q}", 0, f // q)
                        spare = float(f % q)
                        self.lp.row(
                            f"blocked_slots__{node.name}__{g}__{q}",
                            [(col, float(q)), *((c, -v) for c, v in keeps)],
                            lower=-spare,
                        )
                        own: dict[int, float] = defaultdict(float)
                        for c, v in keeps:
                            own[c] += v

                        def lost(
                            subset: list[int],
                            f: int = f,
                            q: int = q,
                            own: dict[int, float] = own,
                        ) -> int:
                            taken = round(sum(own[k] for k in subset))
                            return f // q - max(0, f - taken) // q

                        self._exact_blocking(
                            f"blocked_slots__{node.name}__{g}__{q}", col, sorted(own), lost
                        )
                        self.aux.append((col, keeps, -spare, "touched", float(q)))
                        self.share_slot_cols[(node.name, g, q)] = col
                    rows.share_blocked[q].append((col, 1.0))

    def _blocked_col(self, node: str, whole: int, size: int) -> int:
        kept, own = self._gpu_terms(node)
        col = self.lp.var(f"blocked__{node}__{size}", 0, whole // size)
        spare = float(whole % size)
        self.lp.row(
            f"blocked__{node}__{size}",
            [(col, float(size)), *((c, -v) for c, v in kept)],
            lower=-spare,
        )

        memo = self.union.setdefault(node, {})

        def lost(subset: list[int]) -> int:
            key = tuple(subset)
            taken = memo.get(key)
            if taken is None:
                taken = memo[key] = len(set().union(*(own[k] for k in subset)))
            return whole // size - max(0, whole - taken) // size

        self._exact_blocking(f"blocked__{node}__{size}", col, sorted(own), lost)
        self.aux.append((col, kept, -spare, "touched", float(size)))
        self.slot_cols[(node, size)] = col
        return col
