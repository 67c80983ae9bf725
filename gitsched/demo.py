"""`gitsched demo`: a realistic cluster repo with a history, reconciled end to end.

Four teams, 144 GPUs of three flavors in NVLink domains and racks, a dedicated
pair of nodes for regulated work, and twelve commits by five people, one of
them invalid, plus an open pull request whose plan it prints. Everything runs
locally: git, the embedded SQLite log, the built-in policy's MILP placement.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from audit.history import build_history
from audit.verify import verify_log
from engine import events as ev
from engine.placement.constraints import gpus_text
from eventlog import open_log
from eventlog.codec import decode_all
from gitsched.config import default_log_url
from gitsched.render import state_text, table
from gitsched.render_plan import plan_text
from reconciler.git import GitRepo
from reconciler.loop import Reconciler
from reconciler.plan import plan_change

H = "apiVersion: gitsched.io/v1\n"

CLUSTER = (
    H
    + """kind: Cluster
metadata:
  name: demo
spec:
  topologyLevels: [nvlink, rack, zone]
  gpuFlavors:
    - {name: h100-80g, model: H100, memoryGiB: 80}
    - {name: a100-80g, model: A100, memoryGiB: 80}
    - {name: l40s-48g, model: L40S, memoryGiB: 48}
  priorityClasses:
    - {name: low, value: 100}
    - {name: normal, value: 500}
    - {name: high, value: 900}
  defaultPriorityClass: normal
"""
)

INVENTORY = {
    "inventory/h100-rack-a.yaml": H
    + """kind: NodePool
metadata:
  name: h100-rack-a
spec:
  count: 8
  namePrefix: h100-a-
  template: {flavor: h100-80g, gpus: 8, cpu: 192, memoryGiB: 2048, region: eu-west}
  topology: {rack: rack-a, zone: zone-1}
  domains:
    - {level: nvlink, nodesPerDomain: 2, namePrefix: nvl-a-}
""",
    "inventory/a100-rack-b.yaml": H
    + """kind: NodePool
metadata:
  name: a100-rack-b
spec:
  count: 6
  namePrefix: a100-b-
  template: {flavor: a100-80g, gpus: 8, cpu: 128, memoryGiB: 1024, region: eu-west}
  topology: {rack: rack-b, zone: zone-1}
  domains:
    - {level: nvlink, nodesPerDomain: 1, namePrefix: nvl-b-}
""",
    "inventory/l40s-rack-c.yaml": H
    + """kind: NodePool
metadata:
  name: l40s-rack-c
spec:
  count: 4
  namePrefix: l40s-c-
  template: {flavor: l40s-48g, gpus: 4, cpu: 64, memoryGiB: 512, region: eu-west}
  topology: {rack: rack-c, zone: zone-2}
""",
    "inventory/regulated.yaml": H
    + """kind: Node
metadata:
  name: h100-sec-01
  labels: {compliance: pci-dss}
spec:
  flavor: h100-80g
  gpus: 8
  cpu: 192
  memoryGiB: 2048
  topology: {nvlink: nvl-s-1, rack: rack-s, zone: zone-3}
  region: eu-central
  isolation: dedicated
---
"""
    + H
    + """kind: Node
metadata:
  name: h100-sec-02
  labels: {compliance: pci-dss}
spec:
  flavor: h100-80g
  gpus: 8
  cpu: 192
  memoryGiB: 2048
  topology: {nvlink: nvl-s-1, rack: rack-s, zone: zone-3}
  region: eu-central
  isolation: dedicated
""",
}

POLICY = (
    H
    + """kind: Policy
metadata:
  name: default
spec:
  preemption: {enabled: true, withinQueue: LowerPriority, reclaimWithinCohort: Any}
  admission: {maxGpusPerJob: 64, maxReplicasPerJob: 32}
"""
)


def queue(name: str, cohort: str | None, quotas: str, max_priority: str = "high") -> str:
    cohort_line = f"  cohort: {cohort}\n" if cohort else ""
    return (
        H
        + f"""kind: Queue
metadata:
  name: {name}
spec:
{cohort_line}  weight: 1
  maxPriorityClass: {max_priority}
  quotas:
{quotas}"""
    )


def job(name: str, body: str) -> str:
    return H + f"kind: Job\nmetadata:\n  name: {name}\nspec:\n{body}"


QUEUES = {
    "teams/vision/queue.yaml": queue(
        "vision",
        "research",
        """    - {flavor: h100-80g, nominal: 24, borrowingLimit: 16}
    - {flavor: a100-80g, nominal: 16}
    - {flavor: l40s-48g, nominal: 4}
""",
    ),
    "teams/nlp/queue.yaml": queue(
        "nlp",
        "research",
        """    - {flavor: h100-80g, nominal: 32, borrowingLimit: 8}
    - {flavor: a100-80g, nominal: 16, lendingLimit: 8}
""",
    ),
    "teams/speech/queue.yaml": queue(
        "speech",
        "research",
        """    - {flavor: a100-80g, nominal: 16}
    - {flavor: l40s-48g, nominal: 12}
""",
    ),
    "teams/fraud/queue.yaml": queue(
        "fraud",
        None,
        """    - {flavor: h100-80g, nominal: 16}
""",
        max_priority="high",
    ),
    "teams/vision/OWNERS": "# who approves changes to teams/vision/queue.yaml\nana@vision.example\nkai@vision.example\n",
    "teams/nlp/OWNERS": "li@nlp.example\n",
    "teams/speech/OWNERS": "sam@speech.example\n",
    "teams/fraud/OWNERS": "dev@fraud.example\n",
}

NLP_QUEUE_RAISED = QUEUES["teams/nlp/queue.yaml"].replace("borrowingLimit: 8", "borrowingLimit: 16")

JOBS = {
    "teams/vision/jobs/detector-finetune.yaml": job(
        "detector-finetune",
        """  replicas: 1
  resources: {gpu: 8, cpu: 96, memoryGiB: 1024}
  gpuFlavors: [h100-80g]
  topology: {level: node, mode: required}
  checkpointIntervalMinutes: 20
""",
    ),
    "teams/vision/jobs/notebook.yaml": job(
        "notebook",
        """  replicas: 1
  resources: {gpu: 0.5, cpu: 4, memoryGiB: 32}
  gpuFlavors: [l40s-48g]
  priorityClass: low
""",
    ),
    "teams/nlp/jobs/llama-pretrain.yaml": job(
        "llama-pretrain",
        """  replicas: 4
  resources: {gpu: 8, cpu: 160, memoryGiB: 1800}
  gpuFlavors: [h100-80g]
  topology: {level: rack, mode: required}
  priorityClass: high
  checkpointIntervalMinutes: 30
""",
    ),
    "teams/speech/jobs/asr-inference.yaml": job(
        "asr-inference",
        """  replicas: 3
  resources: {gpu: 0.25, cpu: 4, memoryGiB: 24}
  gpuFlavors: [l40s-48g]
  priorityClass: high
  preemptible: false
""",
    ),
    "teams/speech/jobs/whisper-train.yaml": job(
        "whisper-train",
        """  replicas: 2
  resources: {gpu: 8, cpu: 96, memoryGiB: 768}
  gpuFlavors: [a100-80g]
  topology: {level: rack, mode: preferred}
""",
    ),
    "teams/nlp/jobs/moe-gang.yaml": job(
        "moe-gang",
        """  replicas: 2
  resources: {gpu: 8, cpu: 96, memoryGiB: 1024}
  gpuFlavors: [h100-80g]
  topology: {level: nvlink, mode: required}
  checkpointIntervalMinutes: 15
""",
    ),
    "teams/fraud/jobs/risk-model.yaml": job(
        "risk-model",
        """  replicas: 1
  resources: {gpu: 8, cpu: 64, memoryGiB: 512}
  gpuFlavors: [h100-80g]
  isolation: dedicated
  residency: [eu-central]
  priorityClass: high
  preemptible: false
""",
    ),
    "teams/vision/jobs/video-gen.yaml": job(
        "video-gen",
        """  replicas: 3
  resources: {gpu: 8, cpu: 96, memoryGiB: 1024}
  gpuFlavors: [h100-80g]
  topology: {level: nvlink, mode: required}
  priorityClass: low
""",
    ),
}

VIT_SWEEP_BROKEN = job(
    "vit-sweep",
    """  replicas: four
  resources: {gpus: 1, cpu: 8, memoryGiB: 64}
  gpuFlavors: [a100-80g]
  priorityClass: low
""",
)

VIT_SWEEP = job(
    "vit-sweep",
    """  replicas: 4
  minReplicas: 2
  resources: {gpu: 1, cpu: 8, memoryGiB: 64}
  gpuFlavors: [a100-80g]
  priorityClass: low
""",
)

PRIYA = ("Priya Raman", "priya@platform.example")
ANA = ("Ana Souza", "ana@vision.example")
LI = ("Li Wei", "li@nlp.example")
SAM = ("Sam Okafor", "sam@speech.example")
DEV = ("Dev Patel", "dev@fraud.example")


@dataclass
class Commit:
    author: tuple[str, str]
    message: str
    write: dict[str, str] = field(default_factory=dict)
    remove: tuple[str, ...] = ()


def pick(*paths: str) -> dict[str, str]:
    return {p: JOBS[p] for p in paths}


HISTORY = [
    Commit(
        PRIYA,
        "Bootstrap the cluster: flavors, inventory, default policy",
        {
            "cluster.yaml": CLUSTER,
            **INVENTORY,
            "policies/default.yaml": POLICY,
            "README.md": "# demo cluster\n\nJobs and quotas for the demo GPU cluster, managed by gitsched.\n",
        },
    ),
    Commit(
        PRIYA, "Add the research cohort (vision, nlp, speech) and the fraud queue", dict(QUEUES)
    ),
    Commit(
        ANA,
        "vision: detector fine-tune on one H100 node, and a notebook",
        pick("teams/vision/jobs/detector-finetune.yaml", "teams/vision/jobs/notebook.yaml"),
    ),
    Commit(
        LI, "nlp: llama pretrain, 4x8 H100 in one rack", pick("teams/nlp/jobs/llama-pretrain.yaml")
    ),
    Commit(
        SAM,
        "speech: ASR inference on shared L40S and whisper training",
        pick("teams/speech/jobs/asr-inference.yaml", "teams/speech/jobs/whisper-train.yaml"),
    ),
    Commit(
        ANA,
        "vision: add ViT hyper-parameter sweep",
        {"teams/vision/jobs/vit-sweep.yaml": VIT_SWEEP_BROKEN},
    ),
    Commit(
        ANA,
        "vision: fix the sweep spec (replicas is a number, the field is gpu)",
        {"teams/vision/jobs/vit-sweep.yaml": VIT_SWEEP},
    ),
    Commit(
        LI, "nlp: MoE gang, 2x8 H100 in one NVLink domain", pick("teams/nlp/jobs/moe-gang.yaml")
    ),
    Commit(
        DEV,
        "fraud: risk model on the dedicated PCI nodes",
        pick("teams/fraud/jobs/risk-model.yaml"),
    ),
    Commit(
        PRIYA,
        "Raise nlp's H100 borrowing limit to 16\n\nThe MoE gang needs 16 GPUs beyond nlp's nominal 32.\n\n"
        "Approved-by: Li Wei <li@nlp.example>",
        {"teams/nlp/queue.yaml": NLP_QUEUE_RAISED},
    ),
    Commit(
        SAM,
        "speech: withdraw ASR inference (moved to the serving cluster)",
        remove=("teams/speech/jobs/asr-inference.yaml",),
    ),
    Commit(
        ANA,
        "vision: video generation, 3x8 H100 on one NVLink domain",
        pick("teams/vision/jobs/video-gen.yaml"),
    ),
]

PR_BRANCH = "pr/vision-quota"
VISION_QUEUE_RAISED = QUEUES["teams/vision/queue.yaml"].replace("nominal: 24,", "nominal: 40,")
VIDEO_GEN_ON_A_RACK = JOBS["teams/vision/jobs/video-gen.yaml"].replace(
    "topology: {level: nvlink, mode: required}", "topology: {level: rack, mode: required}"
)
# An open pull request, never merged: `gitsched plan main..pr/vision-quota` shows what it would do.
PULL_REQUEST = Commit(
    ANA,
    "vision: run video-gen on one rack, with H100 nominal 24 -> 40\n\n"
    "No NVLink domain holds 3x8 GPUs; one rack does. The higher nominal quota lets\n"
    "vision reclaim the H100s nlp borrows from the research cohort.",
    {
        "teams/vision/queue.yaml": VISION_QUEUE_RAISED,
        "teams/vision/jobs/video-gen.yaml": VIDEO_GEN_ON_A_RACK,
    },
)

START = 1_763_283_600  # 2025-11-16T09:00:00Z: the demo's history starts a week before "now".


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def _commit(directory: Path, commit: Commit, when: str) -> None:
    for rel, content in commit.write.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    for rel in commit.remove:
        (directory / rel).unlink()
    _git(directory, "add", "-A")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": commit.author[0],
        "GIT_AUTHOR_EMAIL": commit.author[1],
        "GIT_COMMITTER_NAME": commit.author[0],
        "GIT_COMMITTER_EMAIL": commit.author[1],
        "GIT_AUTHOR_DATE": when,
        "GIT_COMMITTER_DATE": when,
    }
    _git(directory, "-c", "commit.gpgsign=false", "commit", "-q", "-m", commit.message, env=env)


def build_demo_repo(directory: Path) -> list[str]:
    """Write the demo history as real commits, and the open pull request as a branch.

    Returns the subjects of main's commits.
    """
    directory.mkdir(parents=True)
    _git(directory, "init", "-q", "-b", "main")
    (directory / ".gitignore").write_text(".gitsched/\n")
    subjects = []
    for i, commit in enumerate(HISTORY):
        _commit(directory, commit, f"@{START + i * 5400} +0000")
        subjects.append(commit.message.splitlines()[0])
    _git(directory, "checkout", "-q", "-b", PR_BRANCH)
    _commit(directory, PULL_REQUEST, f"@{START + len(HISTORY) * 5400} +0000")
    _git(directory, "checkout", "-q", "main")
    return subjects


def run_demo(directory: Path, *, force: bool, echo: Callable[[str], None]) -> int:
    if directory.exists():
        if not force:
            echo(f"{directory} exists: reconciling it again (use --force to start over)")
        else:
            shutil.rmtree(directory)
    if not directory.exists():
        build_demo_repo(directory)
        echo(f"created the demo cluster repo in {directory}/ ({len(HISTORY)} commits by 5 authors)")
    url = default_log_url(directory)
    with open_log(url) as event_log:
        report = Reconciler(GitRepo(directory), event_log).run_once()
        echo("")
        echo(f"== reconcile {directory} -> {url}")
        for outcome in report.commits:
            c = outcome.commit
            mark = "applied " if outcome.applied else "REJECTED"
            echo(f"{mark} {c.sha[:10]} {c.author:<12} {c.subject}")
            for finding in outcome.errors:
                echo(f"           {finding.format()}")
        echo(f"{report.events_appended} events appended")
        solves = [e for _, e in decode_all(event_log.read(0)) if isinstance(e, ev.SolveCompleted)]
        if solves:
            echo("")
            echo(f"== the {len(solves)} solves (one per commit that changed placement)")
            echo(
                table(
                    ["SOLVE", "SOLVER", "STATUS", "PLAN", "OBJECTIVE", "BOUND", "GAP", "SECONDS"],
                    [
                        [
                            s.solve_id.split("/")[0][:10],
                            s.solver,
                            s.status,
                            s.plan_source + (f" ({s.fallback})" if s.fallback else ""),
                            f"{s.objective:.2f}",
                            "-" if s.bound is None else f"{s.bound:.2f}",
                            "-" if s.gap is None else f"{s.gap * 100:.2f}%",
                            f"{s.seconds:.2f}",
                        ]
                        for s in solves
                    ],
                )
            )
        echo("")
        echo(state_text(report.state, report.last_seq))
        echo("")
        echo("== audit summary")
        verification = verify_log(event_log)
        intervals = build_history(decode_all(event_log.read(0)))
        echo(
            f"log: {verification.events} events, hash chain "
            + ("intact" if verification.ok else f"BROKEN at {verification.broken}")
        )
        rows = []
        for team in sorted(report.state.queues):
            mine = [p for k, p in report.state.placements.items() if k.startswith(team + "/")]
            ended = [i for i in intervals if i.queue == team and i.end is not None]
            rows.append(
                [
                    team,
                    len(mine),
                    gpus_text(sum(p.gpu_milli for p in mine)),
                    len([i for i in intervals if i.queue == team]),
                    len(ended),
                ]
            )
        echo(table(["TEAM", "RUNNING", "GPUS", "INTERVALS", "ENDED"], rows))
        repo = GitRepo(directory)
        if repo.has_revision(PR_BRANCH):
            echo("")
            echo(f"== open pull request {PR_BRANCH}, not merged")
            plan = plan_change(repo, event_log, "main", PR_BRANCH)
            echo(plan_text(plan))
        echo("")
        echo(f"try: gitsched state --repo {directory}")
        echo(f"     gitsched plan {directory} main..{PR_BRANCH} --format markdown")
        echo(f"     gitsched audit history --repo {directory} --job nlp/moe-gang")
        echo(f"     gitsched validate {directory} --rev main~6")
    return 0
