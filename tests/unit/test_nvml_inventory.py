"""The NVML inventory turns what NVML reports into a valid Node document."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import yaml

from gitsched.reconciler.nvml import (
    GIB,
    GpuInfo,
    InventoryUnavailable,
    flavor_name,
    gpu_model,
    node_document,
)
from gitsched.schemas import Document, validate_document


def gpu(
    i: int,
    name: str = "NVIDIA H100 80GB HBM3",
    memory: int = 81559 * 1024**2,
    fabric: str | None = None,
) -> GpuInfo:
    return GpuInfo(i, name, f"GPU-{i}", memory, 18, fabric)


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ],
)
def test_gpu_model_from_the_nvml_name(name: str, model: str) -> None:
    assert gpu_model(name) == model


def test_flavor_name_rounds_memory_like_the_marketing_name() -> None:
    assert flavor_name("H100", 81559 * 1024**2) == "h100-80g"
    assert flavor_name("L40S", 46068 * 1024**2) == "l40s-48g"


def test_an_hgx_host_is_a_valid_node_and_its_own_nvlink_domain() -> None:
    doc = node_document(
        [gpu(i) for i in range(8)], name="Host_A.example", region="eu-west", topology={"rack": "r1"}
    )
    assert validate_document(Document("<nvml>", 0, doc, {})) == ()
    assert doc["metadata"]["name"] == "host-a-example"
    assert doc["spec"]["gpus"] == 8 and doc["spec"]["flavor"] == "h100-80g"
    assert doc["spec"]["topology"] == {"rack": "r1"}


def test_a_multi_node_nvlink_fabric_becomes_the_nvlink_domain() -> None:
    doc = node_document([gpu(i, fabric="nvl-abc-3") for i in range(4)], name="gb200-1")
    assert doc["spec"]["topology"]["nvlink"] == "nvl-abc-3"


def test_nvlink_links_nvml_cannot_report_are_not_claimed_as_none() -> None:
    """An H100 SXM passed through to a VM answers NotSupported for NVLink state (seen with
    scripts/gpu-check): the label says nothing rather than "0 active links"."""
    unknown = node_document([dataclasses.replace(gpu(0), nvlinks_active=None)], name="vm")
    assert "nvlink.active-links" not in unknown["metadata"]["labels"]
    assert validate_document(Document("<nvml>", 0, unknown, {})) == ()
    known = node_document([gpu(i) for i in range(8)], name="hgx")
    assert known["metadata"]["labels"]["nvlink.active-links"] == "18"


def test_mixed_gpu_models_are_refused() -> None:
    with pytest.raises(InventoryUnavailable, match="mixed GPU models"):
        node_document([gpu(0), gpu(1, name="NVIDIA L40S", memory=48 * GIB)])


def test_a_cpu_host_has_no_flavor() -> None:
    doc = node_document([], name="cpu-1")
    assert "flavor" not in doc["spec"] and doc["spec"]["gpus"] == 0
    assert validate_document(Document("<nvml>", 0, doc, {})) == ()


def test_the_command_reports_this_host_or_says_why_it_cannot() -> None:
    """On a GPU host: a valid Node document. Elsewhere (CI): one clear line and exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "gitsched", "inventory", "nvml", "--region", "eu"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr
    if done.returncode == 0:
        doc = yaml.safe_load(done.stdout)
        assert validate_document(Document("<nvml>", 0, doc, {})) == ()
        assert doc["spec"]["gpus"] >= 1 and doc["spec"]["flavor"]
    else:
        assert done.returncode == 2
        assert done.stderr.startswith("gitsched: ")
        assert "nvidia-ml-py" in done.stderr or "NVML" in done.stderr


def test_the_utilisation_reader_reads_every_gpu_or_says_why_it_cannot() -> None:
    """On a GPU host: one reading per GPU, 0-100 %; elsewhere a clear InventoryUnavailable."""
    from gitsched.reconciler.nvml import UtilizationReader

    try:
        with UtilizationReader() as reader:
            readings = reader.read()
    except InventoryUnavailable as e:
        assert "nvidia-ml-py" in str(e) or "NVML" in str(e)
        return
    assert [i for i, _ in readings] == list(range(len(readings))) and readings
    assert all(0.0 <= p <= 100.0 for _, p in readings)
