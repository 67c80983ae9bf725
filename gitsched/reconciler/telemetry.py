"""GPU utilisation telemetry into the log, aggregated: idle reclamation (engine/idle.py)
needs minutes of history per GPU, not every sample, so samples are folded into one
GpuUtilizationReported per node and window before anything is appended.

Two sources: the DCGM exporter's `DCGM_FI_DEV_GPU_UTIL` in Prometheus text format (a
file or a scrape URL), and NVML sampled on the node itself (reconciler/nvml.py).
Times are the samples' own (the exposition's timestamps, the agent's sampling times):
this is the edge, where the clock belongs; the log then replays them as recorded.
"""

from __future__ import annotations

import math
import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gitsched.engine import events as ev
from gitsched.engine.errors import PermanentError, TemporaryError

DCGM_METRIC = "DCGM_FI_DEV_GPU_UTIL"
# Labels the node's name may come under: dcgm-exporter's own, then the Prometheus
# relabelling conventions of kube-prometheus and the GPU operator.
NODE_LABELS = ("Hostname", "node", "kubernetes_node", "instance")
MAX_BYTES = 64 * 1024 * 1024
_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class TelemetryError(PermanentError):
    """Telemetry that cannot be read: not Prometheus text, no samples, no time."""


class TelemetryUnavailable(TemporaryError):
    """The scrape URL did not answer."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One GPU's utilisation (0-100 %) at `at` (seconds since the epoch)."""

    node: str
    gpu: int
    at: float
    percent: float
    source: str


def _labels(text: str) -> dict[str, str]:
    out = {}
    for m in _LABEL.finditer(text):
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\\\", "\\").replace("\\n", "\n")
    return out


def parse_dcgm(text: str, at: float | None = None) -> tuple[list[Sample], list[str]]:
    """The DCGM_FI_DEV_GPU_UTIL samples of a Prometheus text exposition, and a line per
    sample that could not be used (no node label, no GPU index, no time, bad value).
    `at`: the time of samples without a timestamp of their own (one scrape's time)."""
    samples: list[Sample] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or not line.startswith(DCGM_METRIC):
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group("name") != DCGM_METRIC:
            if m is None:
                problems.append(f"line {number}: not a Prometheus sample")
            continue
        labels = _labels(m.group("labels") or "")
        node = next((labels[k] for k in NODE_LABELS if labels.get(k)), "")
        if labels.get("instance") == node:
            node = node.rsplit(":", 1)[0]  # an instance is host:port
        try:
            value = float(m.group("value"))
            gpu = int(labels.get("gpu", ""))
        except ValueError:
            problems.append(f"line {number}: no GPU index or a value that is not a number")
            continue
        when = int(m.group("ts")) / 1000.0 if m.group("ts") else at
        if not node or when is None or not math.isfinite(value):
            problems.append(
                f"line {number}: "
                + ("no node label" if not node else "no time" if when is None else "no value")
            )
            continue
        samples.append(Sample(node, gpu, when, min(100.0, max(0.0, value)), "dcgm"))
    return samples, problems


def iso(at: float) -> str:
    """Seconds since the epoch as the log writes times."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def aggregate(samples: Iterable[Sample], window_s: float) -> tuple[ev.GpuUtilizationReported, ...]:
    """One report per node, source and window (aligned to multiples of `window_s` since the
    epoch): per GPU, the mean and highest utilisation and how many samples made them."""
    groups: dict[tuple[str, str, int], dict[int, list[Sample]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for s in samples:
        groups[(s.node, s.source, math.floor(s.at / window_s))][s.gpu].append(s)
    reports = []
    for (node, source, _), by_gpu in sorted(groups.items()):
        times = [s.at for group in by_gpu.values() for s in group]
        gpus = tuple(
            ev.GpuUtilization(
                index=gpu,
                mean_percent=round(sum(s.percent for s in group) / len(group), 3),
                max_percent=max(s.percent for s in group),
                samples=len(group),
            )
            for gpu, group in sorted(by_gpu.items())
        )
        reports.append(
            ev.GpuUtilizationReported(
                node=node, source=source, start=iso(min(times)), end=iso(max(times)), gpus=gpus
            )
        )
    return tuple(sorted(reports, key=lambda r: (r.end, r.node, r.source)))


def read_source(where: str) -> str:
    """A file's text, or a scrape of an http(s) URL."""
    if where.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(where, timeout=10) as answer:
                return str(answer.read(MAX_BYTES).decode("utf-8", "replace"))
        except OSError as e:
            raise TelemetryUnavailable(f"cannot scrape {where}: {e}") from e
    try:
        with open(where, encoding="utf-8", errors="replace") as f:
            return f.read(MAX_BYTES)
    except OSError as e:
        raise TelemetryError(f"cannot read {where}: {e.strerror or e}") from e


def sample_nvml(
    node: str,
    seconds: float,
    interval_s: float,
    read: Callable[[], Sequence[tuple[int, float]]],
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Sample]:
    """Sample every GPU of this node through `read` (reconciler.nvml.read_utilization)
    every `interval_s` for `seconds`: the node agent's side of telemetry."""
    samples: list[Sample] = []
    count = max(1, round(seconds / interval_s))
    for i in range(count):
        at = clock()
        samples.extend(Sample(node, gpu, at, float(percent), "nvml") for gpu, percent in read())
        if i + 1 < count:
            sleep(interval_s)
    return samples


def parse_nvml_record(text: str) -> list[Sample]:
    """Recorded NVML samples (the agent's `--record` output): one JSON object a line,
    {"node", "gpu", "at" (ISO-8601), "percent"}."""
    import json

    samples = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            when = datetime.fromisoformat(str(d["at"]))
            if when.tzinfo is None:
                raise ValueError("a time without an offset")
            samples.append(
                Sample(str(d["node"]), int(d["gpu"]), when.timestamp(), float(d["percent"]), "nvml")
            )
        except (ValueError, KeyError, TypeError) as e:
            raise TelemetryError(f"line {number}: not an NVML sample: {e}") from e
    return samples


def record_line(sample: Sample) -> str:
    import json

    return json.dumps(
        {"node": sample.node, "gpu": sample.gpu, "at": iso(sample.at), "percent": sample.percent}
    )
