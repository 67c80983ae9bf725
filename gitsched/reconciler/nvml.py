"""Live GPU inventory from NVML: what a machine really has, as a Node document; and its
GPUs' utilisation, sampled for idle reclamation (UtilizationReader).

A node agent runs this on each GPU host and commits (or compares) the result
with the static inventory, so a spec never promises GPUs a host does not have.
NVLink domains come from the GPU fabric info (GB200 NVL72: cluster UUID + clique);
where there is none (HGX H100: NVSwitch inside the box) the node is its own domain.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
from dataclasses import dataclass
from typing import Any

from gitsched.engine.errors import TemporaryError

GIB = 1024**3
_FABRIC_STATE_COMPLETED = 3


class InventoryUnavailable(TemporaryError):
    """NVML cannot be used here: no driver, no GPU, or nvidia-ml-py not installed."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_bytes: int
    nvlinks_active: int | None  # None: NVML cannot tell (no NVLink, or a VM that hides it)
    fabric_domain: str | None


def gpu_model(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; 'NVIDIA GeForce RTX 4090' -> 'RTX4090'."""
    text = re.sub(r"^(NVIDIA|Tesla|Quadro|GeForce)\s+", "", name.strip(), flags=re.I)
    text = re.sub(r"^(GeForce)\s+", "", text, flags=re.I)
    words = text.split()
    if not words:
        return "unknown"
    if words[0].upper() == "RTX" and len(words) > 1:
        return f"RTX{words[1]}".upper()
    return words[0].upper()


def flavor_name(model: str, memory_bytes: int) -> str:
    """A DNS-1123 flavor name such as h100-80g, the convention of the demo and docs."""
    gib = round(memory_bytes / GIB / 8) * 8 or max(1, round(memory_bytes / GIB))
    return re.sub(r"[^a-z0-9-]", "-", f"{model.lower()}-{gib}g").strip("-")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_gpus() -> list[GpuInfo]:
    try:
        import pynvml
    except ImportError as e:
        raise InventoryUnavailable(
            "nvidia-ml-py is not installed: pip install 'gitsched[nvml]'"
        ) from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise InventoryUnavailable(f"NVML cannot start (no NVIDIA driver or GPU here?): {e}") from e
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                GpuInfo(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    memory_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    nvlinks_active=_active_nvlinks(pynvml, handle),
                    fabric_domain=_fabric_domain(pynvml, handle),
                )
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


class UtilizationReader:
    """Each GPU's utilisation (0-100 %, the share of the last sample period a kernel ran,
    nvmlDeviceGetUtilizationRates), NVML started once for a run of samples:
    `with UtilizationReader() as r: r.read()`. For idle reclamation (reconciler/telemetry.py)."""

    def __enter__(self) -> UtilizationReader:
        try:
            import pynvml
        except ImportError as e:
            raise InventoryUnavailable(
                "nvidia-ml-py is not installed: pip install 'gitsched[nvml]'"
            ) from e
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise InventoryUnavailable(
                f"NVML cannot start (no NVIDIA driver or GPU here?): {e}"
            ) from e
        self._nvml = pynvml
        self._handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]
        return self

    def read(self) -> list[tuple[int, float]]:
        pynvml = self._nvml
        out = []
        for index, handle in enumerate(self._handles):
            try:
                out.append((index, float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)))
            except pynvml.NVMLError as e:
                raise InventoryUnavailable(
                    f"NVML cannot read GPU {index}'s utilisation: {e}"
                ) from e
        return out

    def __exit__(self, *exc: object) -> None:
        self._nvml.nvmlShutdown()


def _active_nvlinks(pynvml: Any, handle: Any) -> int | None:
    """Active NVLink links; None where NVML cannot tell. A PCIe card, and an SXM GPU passed
    through to a VM (seen on an H100 80GB HBM3 VM, driver 580), answer NotSupported for
    link 0: that is "unknown", not "no links"."""
    active = 0
    for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                active += 1
        except pynvml.NVMLError:
            if link == 0:
                return None
            break
    return active


def _fabric_domain(pynvml: Any, handle: Any) -> str | None:
    """The multi-node NVLink domain (cluster UUID + clique id), if the GPU is in one."""
    getter = getattr(pynvml, "nvmlDeviceGetGpuFabricInfo", None)
    struct = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
    if getter is None or struct is None:
        return None
    info = struct()
    try:
        # nvidia-ml-py fills a caller-owned struct: (device, pointer) -> NVML_SUCCESS.
        getter(handle, ctypes.byref(info))
    except (pynvml.NVMLError, ctypes.ArgumentError):
        return None  # HGX H100 and older: no multi-node fabric, NotSupported
    if int(info.state) != _FABRIC_STATE_COMPLETED or int(info.status) != 0:
        return None
    uuid = bytes(info.clusterUuid).hex()
    if not uuid.strip("0"):
        return None
    return f"nvl-{uuid[:12]}-{int(info.cliqueId)}"


def _memory_gib() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB)
    except (ValueError, OSError):
        return 0


def node_document(
    gpus: list[GpuInfo],
    *,
    name: str | None = None,
    region: str | None = None,
    topology: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A `kind: Node` document for this host, valid against schemas/node.schema.json."""
    node_name = re.sub(r"[^a-z0-9-]", "-", (name or socket.gethostname()).lower()).strip("-")[:63]
    spec: dict[str, Any] = {
        "gpus": len(gpus),
        "cpu": os.cpu_count() or 1,
        "memoryGiB": _memory_gib(),
    }
    labels: dict[str, str] = {}
    if gpus:
        models = {gpu_model(g.name) for g in gpus}
        if len(models) > 1:
            raise InventoryUnavailable(
                f"host has mixed GPU models {sorted(models)}: a gitsched node has one flavor; "
                "split it with one Node per model is not supported"
            )
        model = models.pop()
        spec["flavor"] = flavor_name(model, min(g.memory_bytes for g in gpus))
        labels["gpu.model"] = model
        links = [g.nvlinks_active for g in gpus]
        if all(n is not None for n in links):
            labels["nvlink.active-links"] = str(min(n for n in links if n is not None))
    domains = {g.fabric_domain for g in gpus if g.fabric_domain}
    node_topology = dict(topology or {})
    if len(domains) == 1:
        node_topology.setdefault("nvlink", domains.pop())
    if node_topology:
        spec["topology"] = node_topology
    if region:
        spec["region"] = region
    metadata: dict[str, Any] = {"name": node_name}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "gitsched.io/v1", "kind": "Node", "metadata": metadata, "spec": spec}
