"""Units, written once. Inside gitsched every amount is an integer in its smallest unit
(milli-GPU, milli-CPU, MiB), so capacity sums are exact; specs and reports speak GPUs,
cores and GiB. Every conversion and every GPU amount shown to a person goes through here,
so a spec, a decision's reason and an audit report never disagree on a number.
"""

from __future__ import annotations

GPU_MILLI = 1000  # milli-GPU in one whole GPU; below it, a share of one physical GPU
CPU_MILLI = 1000  # milli-CPU in one core
MIB_PER_GIB = 1024


def milli_from_gpus(gpus: float) -> int:
    """GPUs as a spec writes them (0.5, 8) -> milli-GPU."""
    return round(gpus * GPU_MILLI)


def gpus_from_milli(milli: float) -> float:
    """milli-GPU -> GPUs (a float: shares are fractions)."""
    return milli / GPU_MILLI


def gpus_or_none(milli: int | None) -> float | None:
    """`gpus_from_milli` for an optional amount (a quota limit that is not set)."""
    return None if milli is None else milli / GPU_MILLI


def gpus_value(milli: int) -> int | float:
    """GPUs as a document writes them: an int when whole (8), else a float (0.5)."""
    return milli // GPU_MILLI if milli % GPU_MILLI == 0 else milli / GPU_MILLI


def gpus_text(milli: float) -> str:
    """GPUs as a person reads them: 1000 -> '1', 500 -> '0.5', 16000 -> '16'."""
    if isinstance(milli, int) and milli % GPU_MILLI == 0:
        return str(milli // GPU_MILLI)
    return f"{milli / GPU_MILLI:g}"


def cores_from_milli(milli: float) -> float:
    """milli-CPU -> cores."""
    return milli / CPU_MILLI


def milli_from_cores(cores: float) -> int:
    """Cores as a spec writes them (0.5, 96) -> milli-CPU."""
    return round(cores * CPU_MILLI)


def mib_from_gib(gib: float) -> int:
    """GiB as a spec writes them -> MiB."""
    return round(gib * MIB_PER_GIB)


def gib_from_mib(mib: float) -> float:
    """MiB -> GiB."""
    return mib / MIB_PER_GIB
