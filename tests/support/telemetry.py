"""GPU utilisation as the edge sees it, for tests that feed telemetry to the log."""

from __future__ import annotations


def dcgm_series(node: str, gpus: range, start: int, minutes: int, percent: int) -> str:
    """Scrapes of a dcgm-exporter every five minutes, timestamped (ms), as Prometheus keeps them."""
    lines = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    ]
    for minute in range(0, minutes + 1, 5):
        for g in gpus:
            lines.append(
                f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{g:08x}",device="nvidia{g}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}",container="",namespace="",'
                f'pod=""}} {percent} {(start + minute * 60) * 1000}'
            )
    return "\n".join(lines) + "\n"
