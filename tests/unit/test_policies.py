"""Cross-document rules: every rule holds on a good repo and fires, located, on a bad one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gitsched.findings import Finding
from gitsched.policies import check_repository, default_policy, merge_policies, place_of
from gitsched.schemas import Document, parse_documents, validate_document

DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster-repo.md"

CLUSTER = """\
apiVersion: gitsched.io/v1
kind: Cluster
metadata:
  name: demo
spec:
  topologyLevels: [nvlink, rack, zone]
  gpuFlavors:
    - name: h100-80g
    - name: a100-40g
  priorityClasses:
    - name: low
      value: 100
    - name: normal
      value: 500
    - name: high
      value: 900
  defaultPriorityClass: normal
"""

NODE = """\
apiVersion: gitsched.io/v1
kind: Node
metadata:
  name: {name}
spec:
{spec}"""

QUEUE = """\
apiVersion: gitsched.io/v1
kind: Queue
metadata:
  name: {name}
spec:
{spec}"""

JOB = """\
apiVersion: gitsched.io/v1
kind: Job
metadata:
  name: {name}
spec:
{spec}"""

POOL = """\
apiVersion: gitsched.io/v1
kind: NodePool
metadata:
  name: {name}
spec:
  count: {count}
  namePrefix: {prefix}
  template: {{flavor: h100-80g, gpus: 8, cpu: 192, memoryGiB: 2048}}
{extra}"""

POLICY = """\
apiVersion: gitsched.io/v1
kind: Policy
metadata:
  name: {name}
spec:
{spec}"""

NODE_SPEC = "  flavor: h100-80g\n  gpus: 8\n  cpu: 192\n  memoryGiB: 2048\n"
QUEUE_SPEC = "  maxPriorityClass: normal\n  quotas:\n    - flavor: h100-80g\n      nominal: 16\n"
JOB_SPEC = "  replicas: 2\n  resources: {gpu: 8}\n"


def base_repo() -> dict[str, str]:
    return {
        "cluster.yaml": CLUSTER,
        "inventory/nodes.yaml": NODE.format(name="h100-a-01", spec=NODE_SPEC),
        "teams/vision/queue.yaml": QUEUE.format(name="vision", spec=QUEUE_SPEC),
        "teams/vision/jobs/train.yaml": JOB.format(name="train", spec=JOB_SPEC),
    }


def load(files: dict[str, str]) -> list[Document]:
    docs: list[Document] = []
    for file, text in files.items():
        parsed, errors = parse_documents(text.encode(), file)
        assert errors == (), errors
        for doc in parsed:
            assert validate_document(doc) == (), validate_document(doc)
        docs.extend(parsed)
    return docs


def check(files: dict[str, str]) -> list[Finding]:
    docs = load(files)
    return list(check_repository(docs, merge_policies(docs)))


def where(errors: list[Finding]) -> list[tuple[str, int | None, str, str]]:
    return [(e.file, e.line, e.path, e.code) for e in errors]


def with_files(**changes: str) -> dict[str, str]:
    files = base_repo()
    for key, text in changes.items():
        files[key.replace("__", "/").replace("_yaml", ".yaml")] = text
    return files


def job(spec: str, name: str = "train") -> str:
    return JOB.format(name=name, spec=spec)


def check_job(spec: str) -> list[Finding]:
    files = base_repo()
    files["teams/vision/jobs/train.yaml"] = job(spec)
    return check(files)


# --- the good repo, and the documentation's examples together ---


def test_a_good_repo_has_no_errors() -> None:
    assert check(base_repo()) == []


def test_the_documented_examples_form_a_valid_repo() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text("utf-8"), re.S)
    homes = {
        "Cluster": "cluster.yaml",
        "Node": "inventory/nodes.yaml",
        "NodePool": "inventory/pools.yaml",
        "Queue": "teams/vision/queue.yaml",
        "Job": "teams/vision/jobs/llama.yaml",
        "Policy": "policies/00-default.yaml",
        "InferenceService": "teams/vision/services/chat.yaml",
        "Workspace": "teams/vision/workspaces/notebook.yaml",
    }
    files = {homes[re.search(r"kind: (\w+)", b).group(1)]: b for b in blocks}  # type: ignore[union-attr]
    assert len(files) == 8
    assert check(files) == []


# --- layout ---


def test_no_cluster_is_one_error_on_cluster_yaml() -> None:
    files = base_repo()
    del files["cluster.yaml"]
    assert where(check(files)) == [("cluster.yaml", None, "$", "layout")]


def test_a_second_cluster_is_an_error_on_the_extra_one() -> None:
    files = base_repo()
    files["cluster.yaml"] = CLUSTER + "---\n" + CLUSTER.replace("name: demo", "name: demo2")
    errors = check(files)
    assert where(errors) == [("cluster.yaml", 20, "$.kind", "layout")]
    assert "cluster.yaml:2" in errors[0].message


def test_a_cluster_outside_cluster_yaml_is_the_extra_one() -> None:
    files = with_files(inventory__cluster_yaml=CLUSTER)
    errors = check(files)
    assert {(e.file, e.line, e.code) for e in errors} == {("inventory/cluster.yaml", 2, "layout")}
    assert len(errors) == 2  # misplaced, and a second Cluster


@pytest.mark.parametrize(
    ("file", "text"),
    [
        ("inventory/train.yaml", JOB.format(name="x", spec=JOB_SPEC)),
        ("teams/vision/train.yaml", JOB.format(name="x", spec=JOB_SPEC)),
        ("teams/vision/jobs/deep/train.yaml", JOB.format(name="x", spec=JOB_SPEC)),
        ("teams/vision/jobs/queue.yaml", QUEUE.format(name="other", spec="  weight: 1\n")),
        ("misc/node.yaml", NODE.format(name="n9", spec=NODE_SPEC)),
        ("teams/vision/policy.yaml", POLICY.format(name="p", spec="  solver: {name: cbc}\n")),
    ],
)
def test_documents_must_live_where_their_kind_belongs(file: str, text: str) -> None:
    files = base_repo()
    files[file] = text
    errors = [e for e in check(files) if e.file == file]
    assert [(e.line, e.code) for e in errors] == [(2, "layout")]
    assert "belongs in" in errors[0].message


def test_a_team_has_one_queue() -> None:
    files = base_repo()
    files["teams/vision/queue.yaml"] += "---\n" + QUEUE.format(name="vision2", spec="  weight: 1\n")
    assert where(check(files)) == [("teams/vision/queue.yaml", 12, "$.kind", "layout")]


def test_place_of() -> None:
    assert place_of("teams/nlp/jobs/a.yml").area == "jobs"
    assert place_of("teams/nlp/jobs/a.yml").team == "nlp"
    assert place_of("teams/nlp/queue.yaml").team == "nlp"
    assert place_of("cluster.yaml").area == "cluster"
    assert place_of("README.md").area == "elsewhere"
    assert place_of("policies/sub/a.yaml").area == "elsewhere"


# --- duplicate names ---


def test_two_queues_with_one_name_point_at_both() -> None:
    files = with_files(teams__nlp__queue_yaml=QUEUE.format(name="vision", spec="  weight: 2\n"))
    errors = check(files)
    assert where(errors) == [
        ("teams/nlp/queue.yaml", 4, "$.metadata.name", "duplicate-name"),
        ("teams/vision/queue.yaml", 4, "$.metadata.name", "duplicate-name"),
    ]
    assert "teams/vision/queue.yaml:4" in errors[0].message
    assert "teams/nlp/queue.yaml:4" in errors[1].message


def test_two_jobs_with_one_name_in_one_queue() -> None:
    files = with_files(teams__vision__jobs__again_yaml=job(JOB_SPEC))
    assert where(check(files)) == [
        ("teams/vision/jobs/again.yaml", 4, "$.metadata.name", "duplicate-name"),
        ("teams/vision/jobs/train.yaml", 4, "$.metadata.name", "duplicate-name"),
    ]


def test_jobs_with_one_name_in_different_queues_are_fine() -> None:
    files = with_files(
        teams__nlp__queue_yaml=QUEUE.format(name="nlp", spec="  weight: 1\n"),
        teams__nlp__jobs__train_yaml=job(JOB_SPEC),
    )
    assert check(files) == []


def test_a_team_may_not_submit_to_another_teams_queue() -> None:
    files = with_files(
        teams__nlp__queue_yaml=QUEUE.format(name="nlp", spec="  weight: 1\n"),
        teams__nlp__jobs__train_yaml=job("  queue: vision\n" + JOB_SPEC),
    )
    errors = [e for e in check(files) if e.code == "ownership"]
    assert where(errors) == [("teams/nlp/jobs/train.yaml", 6, "$.spec.queue", "ownership")]
    assert "team 'vision' owns (teams/vision/queue.yaml)" in errors[0].message
    files["teams/nlp/jobs/train.yaml"] = job("  queue: nlp\n" + JOB_SPEC)
    assert check(files) == []


def test_two_nodes_with_one_name() -> None:
    files = with_files(inventory__more_yaml=NODE.format(name="h100-a-01", spec=NODE_SPEC))
    assert where(check(files)) == [
        ("inventory/more.yaml", 4, "$.metadata.name", "duplicate-name"),
        ("inventory/nodes.yaml", 4, "$.metadata.name", "duplicate-name"),
    ]


def test_node_pool_names_clash_with_nodes_and_other_pools() -> None:
    files = with_files(
        inventory__pools_yaml=POOL.format(name="a", count=4, prefix="h100-a-", extra="")
        + "---\n"
        + POOL.format(name="b", count=2, prefix="h100-a-", extra="")
        + "---\n"
        + POOL.format(name="c", count=100, prefix="h100-a-", extra=""),
    )
    errors = check(files)
    clashes = {(e.file, e.line) for e in errors}
    assert {e.code for e in errors} == {"duplicate-name"}
    # pool a makes h100-a-01 (node); b makes h100-a-01/02 (node, pool a); c makes h100-a-001
    assert ("inventory/nodes.yaml", 4) in clashes
    assert ("inventory/pools.yaml", 7) in clashes  # pool a's namePrefix
    assert ("inventory/pools.yaml", 16) in clashes  # pool b's namePrefix
    assert not any(e.line == 25 for e in errors)  # pool c's 3-digit names do not clash
    message = next(e.message for e in errors if e.line == 16)
    assert "node pool 'b' makes node 'h100-a-01'" in message


def test_two_pools_or_policies_with_one_name() -> None:
    policy = POLICY.format(name="p", spec="  solver: {name: cbc}\n")
    files = with_files(policies__a_yaml=policy, policies__b_yaml=policy)
    assert where(check(files)) == [
        ("policies/a.yaml", 4, "$.metadata.name", "duplicate-name"),
        ("policies/b.yaml", 4, "$.metadata.name", "duplicate-name"),
    ]
    pool = POOL.format(name="p", count=2, prefix="x-", extra="")
    files = with_files(inventory__p_yaml=pool + "---\n" + pool.replace("x-", "y-"))
    assert [(e.line, e.code) for e in check(files)] == [
        (4, "duplicate-name"),
        (13, "duplicate-name"),
    ]


def test_cluster_flavor_and_priority_class_names_are_unique() -> None:
    cluster = CLUSTER.replace("- name: a100-40g", "- name: h100-80g").replace(
        "- name: high", "- name: low"
    )
    errors = check(with_files(cluster_yaml=cluster))
    assert where(errors) == [
        ("cluster.yaml", 9, "$.spec.gpuFlavors[1].name", "duplicate-name"),
        ("cluster.yaml", 15, "$.spec.priorityClasses[2].name", "duplicate-name"),
    ]
    assert "first at cluster.yaml:8" in errors[0].message


# --- references ---


def test_job_queue_must_exist() -> None:
    errors = check_job("  queue: visoin\n" + JOB_SPEC)
    assert where(errors) == [("teams/vision/jobs/train.yaml", 6, "$.spec.queue", "reference")]
    assert "did you mean 'vision'" in errors[0].message


def test_a_team_without_queue_yaml_is_an_error_for_its_jobs() -> None:
    files = with_files(teams__nlp__jobs__bert_yaml=job(JOB_SPEC, name="bert"))
    errors = check(files)
    assert where(errors) == [("teams/nlp/jobs/bert.yaml", 5, "$.spec", "reference")]
    assert "teams/nlp/ has no queue.yaml" in errors[0].message
    files["teams/nlp/jobs/bert.yaml"] = job("  queue: vision\n" + JOB_SPEC, name="bert")
    assert [e.code for e in check(files)] == ["ownership"]


def test_job_flavors_priority_and_topology_must_exist() -> None:
    errors = check_job(
        JOB_SPEC
        + "  gpuFlavors: [h100-80g, b200]\n"  # 8
        + "  priorityClass: urgent\n"  # 9
        + "  topology: {level: row}\n"  # 10
    )
    assert where(errors) == [
        ("teams/vision/jobs/train.yaml", 8, "$.spec.gpuFlavors[1]", "reference"),
        ("teams/vision/jobs/train.yaml", 9, "$.spec.priorityClass", "reference"),
        ("teams/vision/jobs/train.yaml", 10, "$.spec.topology.level", "reference"),
    ]
    assert "known: h100-80g, a100-40g" in errors[0].message
    assert "known: node, nvlink, rack, zone" in errors[2].message


@pytest.mark.parametrize("level", ["node", "nvlink", "zone"])
def test_job_topology_level_node_or_a_cluster_level(level: str) -> None:
    assert check_job(JOB_SPEC + f"  topology: {{level: {level}, mode: preferred}}\n") == []


def test_node_flavor_and_topology_labels_must_exist() -> None:
    spec = NODE_SPEC.replace("h100-80g", "h200") + "  topology: {rack: r1, row: w1}\n"
    errors = check(with_files(inventory__nodes_yaml=NODE.format(name="n1", spec=spec)))
    assert where(errors) == [
        ("inventory/nodes.yaml", 6, "$.spec.flavor", "reference"),
        ("inventory/nodes.yaml", 10, "$.spec.topology.row", "reference"),
    ]


def test_pool_template_topology_and_domains_must_exist() -> None:
    extra = "  topology: {rack: r1, aisle: a1}\n  domains:\n    - {level: nvl, nodesPerDomain: 2, namePrefix: n-}\n"
    pool = POOL.format(name="p", count=4, prefix="p-", extra=extra).replace("h100-80g", "h200")
    errors = check(with_files(inventory__pool_yaml=pool))
    assert where(errors) == [
        ("inventory/pool.yaml", 8, "$.spec.template.flavor", "reference"),
        ("inventory/pool.yaml", 9, "$.spec.topology.aisle", "reference"),
        ("inventory/pool.yaml", 11, "$.spec.domains[0].level", "reference"),
    ]


def test_pool_domain_levels_are_split_once() -> None:
    extra = (
        "  topology: {rack: r1}\n  domains:\n"
        "    - {level: rack, nodesPerDomain: 2, namePrefix: r-}\n"
        "    - {level: nvlink, nodesPerDomain: 2, namePrefix: n-}\n"
        "    - {level: nvlink, nodesPerDomain: 1, namePrefix: m-}\n"
    )
    errors = check(
        with_files(inventory__pool_yaml=POOL.format(name="p", count=4, prefix="p-", extra=extra))
    )
    assert [(e.line, e.code) for e in errors] == [(11, "policy"), (13, "policy")]


def test_queue_flavors_and_max_priority_must_exist() -> None:
    spec = "  maxPriorityClass: top\n  quotas:\n    - flavor: h200\n      nominal: 4\n"
    errors = check(with_files(teams__vision__queue_yaml=QUEUE.format(name="vision", spec=spec)))
    assert where(errors) == [
        ("teams/vision/queue.yaml", 6, "$.spec.maxPriorityClass", "reference"),
        ("teams/vision/queue.yaml", 8, "$.spec.quotas[0].flavor", "reference"),
    ]


def test_default_priority_class_must_exist() -> None:
    errors = check(
        with_files(
            cluster_yaml=CLUSTER.replace(
                "defaultPriorityClass: normal", "defaultPriorityClass: mid"
            )
        )
    )
    assert where(errors) == [("cluster.yaml", 17, "$.spec.defaultPriorityClass", "reference")]


def test_queue_team_must_match_its_folder() -> None:
    ok = QUEUE.format(name="vision", spec="  team: vision\n" + QUEUE_SPEC)
    assert check(with_files(teams__vision__queue_yaml=ok)) == []
    bad = QUEUE.format(name="vision", spec="  team: nlp\n" + QUEUE_SPEC)
    errors = check(with_files(teams__vision__queue_yaml=bad))
    assert where(errors) == [("teams/vision/queue.yaml", 6, "$.spec.team", "reference")]


def test_without_a_cluster_references_to_it_are_not_flooded() -> None:
    files = base_repo()
    del files["cluster.yaml"]
    files["teams/vision/jobs/train.yaml"] = job(JOB_SPEC + "  priorityClass: nope\n")
    assert [e.code for e in check(files)] == ["layout"]


# --- admission ---


def test_max_gpus_per_job() -> None:
    assert check_job("  replicas: 64\n  resources: {gpu: 8}\n") == []  # 512: the default limit
    errors = check_job("  replicas: 65\n  resources: {gpu: 8}\n")
    assert where(errors) == [("teams/vision/jobs/train.yaml", 7, "$.spec.resources.gpu", "policy")]
    assert "asks for 520 GPUs (65 replicas x 8), more than the 512" in errors[0].message


def test_max_gpus_follows_the_merged_policy() -> None:
    tight = POLICY.format(name="tight", spec="  admission: {maxGpusPerJob: 8}\n")
    loose = POLICY.format(name="loose", spec="  admission: {maxGpusPerJob: null}\n")
    files = with_files(policies__10_tight_yaml=tight)
    assert [e.code for e in check(files)] == ["policy"]  # 2 x 8 = 16 > 8
    files["policies/20-loose.yaml"] = loose
    assert check(files) == []


def test_max_replicas_per_job() -> None:
    assert check_job("  replicas: 128\n  resources: {gpu: 1}\n") == []
    errors = check_job("  replicas: 129\n  resources: {gpu: 1}\n")
    assert where(errors) == [("teams/vision/jobs/train.yaml", 6, "$.spec.replicas", "policy")]


def test_min_replicas_at_most_replicas() -> None:
    assert check_job("  replicas: 4\n  minReplicas: 4\n  resources: {gpu: 1}\n") == []
    errors = check_job("  replicas: 4\n  minReplicas: 5\n  resources: {gpu: 1}\n")
    assert where(errors) == [("teams/vision/jobs/train.yaml", 7, "$.spec.minReplicas", "policy")]
    assert errors[0].message == "minReplicas (5) is more than replicas (4)"


def test_fractional_gpus_with_several_replicas_are_allowed() -> None:
    assert check_job("  replicas: 4\n  resources: {gpu: 0.25}\n") == []


def test_priority_class_above_the_queue_maximum() -> None:
    assert check_job(JOB_SPEC + "  priorityClass: low\n") == []
    assert check_job(JOB_SPEC + "  priorityClass: normal\n") == []
    errors = check_job(JOB_SPEC + "  priorityClass: high\n")
    assert where(errors) == [("teams/vision/jobs/train.yaml", 8, "$.spec.priorityClass", "policy")]
    assert errors[0].message.startswith(
        "job 'train' asks for priority class 'high' (900) but queue 'vision' allows at most"
        " 'normal' (500)"
    )


def test_the_default_priority_class_also_counts_against_the_queue_maximum() -> None:
    files = base_repo()
    files["cluster.yaml"] = CLUSTER.replace(
        "defaultPriorityClass: normal", "defaultPriorityClass: high"
    )
    errors = check(files)
    assert where(errors) == [("teams/vision/jobs/train.yaml", 5, "$.spec", "policy")]
    assert "gets the cluster's default priority class 'high'" in errors[0].message


def test_dedicated_jobs_need_residency_when_the_policy_says_so() -> None:
    dedicated = JOB_SPEC + "  isolation: dedicated\n"
    assert check_job(dedicated) == []  # the default policy does not require it
    strict = POLICY.format(name="strict", spec="  admission: {requireResidencyForIsolated: true}\n")
    files = with_files(policies__strict_yaml=strict)
    files["teams/vision/jobs/train.yaml"] = job(dedicated)
    errors = check(files)
    assert where(errors) == [("teams/vision/jobs/train.yaml", 8, "$.spec.isolation", "policy")]
    files["teams/vision/jobs/train.yaml"] = job(dedicated + "  residency: [eu-west]\n")
    assert check(files) == []


@pytest.mark.parametrize(
    ("spec", "line"),
    [
        ("  flavor: h100-80g\n  gpus: 0\n  cpu: 8\n  memoryGiB: 64\n", 7),
        ("  gpus: 4\n  cpu: 8\n  memoryGiB: 64\n", 6),
    ],
)
def test_node_gpus_match_its_flavor(spec: str, line: int) -> None:
    errors = check(with_files(inventory__nodes_yaml=NODE.format(name="n1", spec=spec)))
    assert where(errors) == [("inventory/nodes.yaml", line, "$.spec.gpus", "policy")]


def test_a_cpu_only_node_is_fine() -> None:
    spec = "  gpus: 0\n  cpu: 8\n  memoryGiB: 64\n"
    assert check(with_files(inventory__nodes_yaml=NODE.format(name="n1", spec=spec))) == []


def test_pool_template_gpus_match_its_flavor() -> None:
    pool = POOL.format(name="p", count=2, prefix="p-", extra="").replace("gpus: 8", "gpus: 0")
    errors = check(with_files(inventory__pool_yaml=pool))
    assert where(errors) == [("inventory/pool.yaml", 8, "$.spec.template.gpus", "policy")]


def test_queue_lists_each_flavor_once_and_lends_at_most_its_nominal() -> None:
    spec = (
        "  quotas:\n"
        "    - {flavor: h100-80g, nominal: 8, lendingLimit: 8}\n"
        "    - {flavor: a100-40g, nominal: 4, lendingLimit: 5}\n"
        "    - {flavor: h100-80g, nominal: 2}\n"
    )
    errors = check(with_files(teams__vision__queue_yaml=QUEUE.format(name="vision", spec=spec)))
    assert where(errors) == [
        ("teams/vision/queue.yaml", 8, "$.spec.quotas[1].lendingLimit", "policy"),
        ("teams/vision/queue.yaml", 9, "$.spec.quotas[2].flavor", "policy"),
    ]
    assert "first at teams/vision/queue.yaml:7" in errors[1].message


# --- the policy itself ---


def test_default_policy_is_the_documented_one() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text("utf-8"), re.S)
    (policy_block,) = [b for b in blocks if "kind: Policy" in b]
    documented = load({"policies/x.yaml": policy_block})[0].data["spec"]
    assert default_policy() == documented


def test_default_policy_is_a_fresh_copy() -> None:
    default_policy()["admission"]["maxGpusPerJob"] = 1
    assert default_policy()["admission"]["maxGpusPerJob"] == 512


def test_merge_policies_deep_merges_in_file_name_order() -> None:
    docs = load(
        {
            "policies/20-b.yaml": POLICY.format(name="b", spec="  solver: {name: cbc}\n"),
            "policies/10-a.yaml": POLICY.format(
                name="a", spec="  solver: {name: highs, timeLimitSeconds: 60}\n"
            ),
            "cluster.yaml": CLUSTER,
        }
    )
    merged: dict[str, Any] = merge_policies(docs)
    assert merged["solver"] == {
        "name": "cbc",
        "timeLimitSeconds": 60,
        "gapTolerance": 0.01,
        "nodeLimit": 100,
        "levels": "weighted",
    }
    assert merged["admission"] == default_policy()["admission"]
    assert merge_policies([]) == default_policy()


def test_job_slices_are_a_whole_number_below_the_level() -> None:
    errors = check_job(
        "  replicas: 6\n  resources: {gpu: 8}\n"
        "  topology: {level: zone, sliceSize: 4, sliceLevel: nvlink}\n"  # 8
    )
    assert where(errors) == [
        ("teams/vision/jobs/train.yaml", 8, "$.spec.topology.sliceSize", "policy")
    ]
    assert "replicas (6) is not a multiple of sliceSize (4)" in errors[0].message
    errors = check_job(
        "  replicas: 4\n  resources: {gpu: 8}\n"
        "  topology: {level: nvlink, sliceSize: 2, sliceLevel: rack}\n"  # 8
    )
    assert where(errors) == [
        ("teams/vision/jobs/train.yaml", 8, "$.spec.topology.sliceLevel", "policy")
    ]
    assert "sliceLevel 'rack' must be below level 'nvlink'" in errors[0].message
    good = "  replicas: 4\n  resources: {gpu: 8}\n  topology: {level: zone, sliceSize: 2, sliceLevel: rack}\n"
    assert check_job(good) == []


def test_an_unconstrained_job_names_no_level() -> None:
    errors = check_job(JOB_SPEC + "  topology: {mode: unconstrained, level: rack}\n")  # 8
    assert where(errors) == [("teams/vision/jobs/train.yaml", 8, "$.spec.topology.level", "policy")]
    assert check_job(JOB_SPEC + "  topology: {mode: unconstrained}\n") == []
