"""Small openb-format trace files (nodes and pods CSVs) for the benchmark tests."""

from __future__ import annotations

import random
from pathlib import Path


def write_trace(directory: Path) -> tuple[Path, Path]:
    rng = random.Random(3)
    nodes = [NODE_HEADER]
    for i in range(12):
        model, gpus = rng.choice([("V100M16", 8), ("T4", 2), ("P100", 4)])
        nodes.append(f"node-{i:02d},{rng.choice([64000, 96000])},{262144},{gpus},{model}")
    pods = [POD_HEADER]
    for i in range(60):
        kind = rng.random()
        if kind < 0.4:  # a share of one GPU
            gpu, milli, spec = 1, rng.choice([250, 500, 810, 190]), ""
        elif kind < 0.8:
            gpu, milli, spec = rng.choice([1, 2, 4]), 1000, rng.choice(["", "V100M16|P100"])
        else:
            gpu, milli, spec = 0, 0, ""
        cpu = rng.choice([4000, 8000, 16000])
        pods.append(f"pod-{i:03d},{cpu},{16384},{gpu},{milli},{spec},LS,Running,1,2,1")
    node_file, pod_file = directory / "nodes.csv", directory / "pods.csv"
    node_file.write_text("\n".join(nodes) + "\n")
    pod_file.write_text("\n".join(pods) + "\n")
    return node_file, pod_file


NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"


POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
