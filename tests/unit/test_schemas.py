"""The JSON Schemas and their validator: the documented examples pass, mistakes are located."""

from __future__ import annotations

import json
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gitsched.findings import Finding
from gitsched.schemas import (
    KINDS,
    Document,
    parse_documents,
    schema_for,
    validate_document,
    validate_envelope,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster-repo.md"


def doc_examples() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOC.read_text("utf-8"), re.S)


def load(text: str, file: str = "teams/vision/jobs/train.yaml") -> Document:
    docs, errors = parse_documents(text.encode(), file)
    assert errors == (), errors
    (doc,) = docs
    return doc


def check(text: str) -> list[Finding]:
    return list(validate_document(load(text)))


JOB_HEAD = "apiVersion: gitsched.io/v1\nkind: Job\nmetadata:\n  name: train\nspec:\n"


def job(spec_lines: str) -> list[Finding]:
    return check(JOB_HEAD + spec_lines)


# --- the schema files themselves ---


@pytest.mark.parametrize("kind", [*KINDS, "Envelope"])
def test_schema_files_are_valid_draft_2020_12(kind: str) -> None:
    schema = schema_for(kind)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_schema_files_are_named_after_their_kind() -> None:
    names = sorted(p.name for p in files("gitsched.schemas").iterdir() if p.name.endswith(".json"))
    # Besides the kinds: the `autoscaling` block an InferenceService embeds (schemas/autoscaling.py).
    expected = sorted(f"{k.lower()}.schema.json" for k in [*KINDS, "Envelope", "Autoscaling"])
    assert names == expected


def _objects(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            found.append(node)
        for value in node.values():
            found.extend(_objects(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_objects(value))
    return found


@pytest.mark.parametrize("kind", [*KINDS, "Envelope"])
def test_every_object_with_properties_forbids_unknown_fields(kind: str) -> None:
    for obj in _objects(schema_for(kind)):
        assert obj.get("additionalProperties") is False, obj.get("properties", {}).keys()


def test_schema_for_returns_a_copy_and_rejects_unknown_kinds() -> None:
    schema_for("Job")["properties"].clear()
    assert "spec" in schema_for("Job")["properties"]
    with pytest.raises(KeyError):
        schema_for("Jobb")


# --- the documentation stays true ---


def test_the_documentation_has_an_example_of_every_kind() -> None:
    kinds = {load(block, "x.yaml").kind for block in doc_examples()}
    assert kinds == set(KINDS)


@pytest.mark.parametrize("block", doc_examples(), ids=lambda b: b.split("kind: ")[1].split()[0])
def test_every_documented_example_is_valid(block: str) -> None:
    assert validate_document(load(block, "x.yaml")) == ()


# --- located, readable errors ---


def test_unknown_field_is_reported_at_its_line_with_the_allowed_fields() -> None:
    errors = job("  replicas: 2\n  resources:\n    gpuz: 1\n")
    assert [(e.line, e.column, e.path, e.code) for e in errors] == [
        (8, 5, "$.spec.resources.gpuz", "schema")
    ]
    message = errors[0].message
    assert "unknown field 'gpuz'" in message
    assert "did you mean 'gpu'" in message
    assert "allowed: gpu, cpu, memoryGiB" in message


def test_wrong_type_names_the_expected_type_and_what_was_found() -> None:
    errors = job("  replicas: four\n  resources: {gpu: 1}\n")
    assert [(e.line, e.path) for e in errors] == [(6, "$.spec.replicas")]
    assert errors[0].message == "must be a whole number (found 'four')"


def test_yaml_booleans_in_string_fields_get_a_hint() -> None:
    errors = job("  replicas: 1\n  resources: {gpu: 1}\n  residency: [no]\n")
    assert errors[0].path == "$.spec.residency[0]"
    assert "quote" in errors[0].message


def test_missing_required_fields_point_at_the_parent() -> None:
    errors = check(
        "apiVersion: gitsched.io/v1\nkind: Node\nmetadata: {name: n1}\nspec:\n  gpus: 0\n"
    )
    assert [(e.line, e.path, e.message) for e in errors] == [
        (4, "$.spec", "missing required field 'cpu'"),
        (4, "$.spec", "missing required field 'memoryGiB'"),
    ]
    errors = check("apiVersion: gitsched.io/v1\nkind: Queue\n")
    assert {e.message for e in errors} == {
        "missing required field 'metadata'",
        "missing required field 'spec'",
    }
    assert {e.line for e in errors} == {1}


def test_all_errors_of_a_document_are_reported_sorted_by_line() -> None:
    errors = check(
        "apiVersion: gitsched.io/v1\n"
        "kind: Job\n"
        "metadata:\n"
        "  name: My_Job\n"  # 4
        "spec:\n"
        "  replicas: 0\n"  # 6
        "  minReplicas: 5000\n"  # 7
        "  resources: {gpu: 1.5}\n"  # 8
        "  gpuFlavors: [a, a]\n"  # 9
        "  topology: {mode: requird}\n"  # 10
        "  isolation: dedicatd\n"  # 11
        "  residency: []\n"  # 12
        "  extra: 1\n"  # 13
    )
    assert [e.line for e in errors] == [4, 6, 7, 8, 9, 10, 10, 11, 12, 13]
    by_path = {e.path: e.message for e in errors}
    assert "DNS-1123 label" in by_path["$.metadata.name"]
    assert by_path["$.spec.replicas"] == "must be at least 1 (found 0)"
    assert by_path["$.spec.minReplicas"] == "must be at most 4096 (found 5000)"
    assert "whole number of GPUs, or a fraction" in by_path["$.spec.resources.gpu"]
    assert "listed more than once" in by_path["$.spec.gpuFlavors[1]"]
    assert by_path["$.spec.topology"] == "missing required field 'level'"
    assert "did you mean 'required'" in by_path["$.spec.topology.mode"]
    assert "did you mean 'dedicated'" in by_path["$.spec.isolation"]
    assert by_path["$.spec.residency"] == "must list at least one item"
    assert by_path["$.spec.extra"].startswith("unknown field 'extra'")
    assert "(allowed: queue, replicas" in by_path["$.spec.extra"]


@pytest.mark.parametrize(
    ("gpu", "ok"),
    [
        ("0.25", True),
        ("0.5", True),
        ("1", True),
        ("8", True),
        ("2.0", True),
        ("1.5", False),
        ("0", False),
        ("-1", False),
        ("2048", False),
    ],
)
def test_gpu_is_a_whole_number_or_a_fraction_below_one(gpu: str, ok: bool) -> None:
    errors = job(f"  replicas: 1\n  resources: {{gpu: {gpu}}}\n")
    assert (errors == []) is ok, errors


@pytest.mark.parametrize(("replicas", "ok"), [("1", True), ("4096", True), ("4097", False)])
def test_replicas_range(replicas: str, ok: bool) -> None:
    assert (job(f"  replicas: {replicas}\n  resources: {{cpu: 1}}\n") == []) is ok


def test_resources_may_not_be_empty() -> None:
    errors = job("  replicas: 1\n  resources: {}\n")
    assert [(e.path, e.message) for e in errors] == [("$.spec.resources", "must not be empty")]


def test_names_are_dns_labels_of_at_most_63_characters() -> None:
    head = "apiVersion: gitsched.io/v1\nkind: Queue\nmetadata:\n  name: "
    assert check(head + "a" * 63 + "\nspec: {}\n") == []
    (error,) = check(head + "a" * 64 + "\nspec: {}\n")
    assert error.message == "must be at most 63 characters (found 64)"
    for bad in ("-a", "a-", "A", "a_b", "a.b"):
        (error,) = check(head + f"'{bad}'\nspec: {{}}\n")
        assert error.line == 4 and "DNS-1123" in error.message


def test_metadata_labels_are_strings() -> None:
    head = "apiVersion: gitsched.io/v1\nkind: Queue\nmetadata:\n  name: q\n"
    assert check(head + "  labels: {team: a}\n  annotations: {note: hi}\nspec: {}\n") == []
    (error,) = check(head + "  labels: {team: 3}\nspec: {}\n")
    assert (error.line, error.path) == (5, "$.metadata.labels.team")


def test_topology_keys_are_checked_at_the_key() -> None:
    errors = check(
        "apiVersion: gitsched.io/v1\nkind: Node\nmetadata: {name: n}\n"
        "spec:\n  gpus: 0\n  cpu: 1\n  memoryGiB: 1\n  topology:\n    Rack: r1\n"
    )
    assert [(e.line, e.path) for e in errors] == [(9, "$.spec.topology.Rack")]
    assert errors[0].message.startswith("key 'Rack':")


def test_node_is_not_a_topology_level_to_list() -> None:
    (error,) = check(
        "apiVersion: gitsched.io/v1\nkind: Cluster\nmetadata: {name: c}\n"
        "spec:\n  topologyLevels: [node, rack]\n"
    )
    assert error.path == "$.spec.topologyLevels[0]"
    assert "implicit" in error.message


def test_enums() -> None:
    head = "apiVersion: gitsched.io/v1\nkind: Policy\nmetadata: {name: p}\nspec:\n"
    assert check(head + "  solver: {name: highs}\n  preemption: {withinQueue: Never}\n") == []
    errors = check(head + "  solver: {name: gurobi}\n  preemption: {reclaimWithinCohort: All}\n")
    assert [e.path for e in errors] == [
        "$.spec.solver.name",
        "$.spec.preemption.reclaimWithinCohort",
    ]
    assert errors[0].message == (
        "must be one of 'greedy', 'highs', 'cbc', 'cpsat' (found 'gurobi')"
    )


def test_policy_limits_may_be_null_to_lift_them() -> None:
    head = "apiVersion: gitsched.io/v1\nkind: Policy\nmetadata: {name: p}\nspec:\n"
    assert check(head + "  admission: {maxGpusPerJob: null}\n") == []


# --- apiVersion and kind ---


def test_unknown_kind_lists_the_known_kinds() -> None:
    (error,) = check("apiVersion: gitsched.io/v1\nmetadata: {name: a}\nkind: Jobb\nspec: {}\n")
    assert (error.line, error.path, error.code) == (3, "$.kind", "unknown-kind")
    assert "did you mean 'Job'" in error.message
    assert "Cluster, Node, NodePool, Queue, Job, Policy" in error.message


def test_missing_kind() -> None:
    (error,) = check("apiVersion: gitsched.io/v1\nmetadata: {name: a}\n")
    assert (error.line, error.path, error.code) == (1, "$", "unknown-kind")


def test_wrong_api_version_is_reported_once_and_validation_goes_on() -> None:
    errors = job("  replicas: 0\n  resources: {gpu: 1}\n").copy()
    assert [e.path for e in errors] == ["$.spec.replicas"]
    errors = check(JOB_HEAD.replace("v1", "v2") + "  replicas: 0\n  resources: {gpu: 1}\n")
    assert [(e.line, e.path) for e in errors] == [(1, "$.apiVersion"), (6, "$.spec.replicas")]
    assert errors[0].message == "apiVersion must be 'gitsched.io/v1' (found 'gitsched.io/v2')"
    errors = check("kind: Job\nmetadata: {name: a}\nspec: {replicas: 1, resources: {gpu: 1}}\n")
    assert [(e.path, e.message) for e in errors] == [
        ("$", "missing required field 'apiVersion' (use 'gitsched.io/v1')")
    ]


def test_errors_serialise() -> None:
    (error,) = job("  replicas: 0\n  resources: {gpu: 1}\n")
    assert json.loads(json.dumps(error.to_dict()))["path"] == "$.spec.replicas"
    assert error.format() == (
        "teams/vision/jobs/train.yaml:6:3: $.spec.replicas: must be at least 1 (found 0) [schema]"
    )


# --- the event envelope ---

GOOD_EVENT: dict[str, Any] = {
    "seq": 1,
    "id": "3f2a:0",
    "type": "JobSubmitted",
    "schema_version": 1,
    "data": {"job": "train"},
    "time": "2024-05-01T12:00:00.000001Z",
    "actor": "ada@example.org",
    "cause": "3f2a",
    "prev_hash": "0" * 64,
    "hash": "ab" * 32,
}


def test_envelope_accepts_a_stored_event() -> None:
    assert validate_envelope(GOOD_EVENT) == ()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", 0),
        ("schema_version", 0),
        ("time", "2024-13-01T00:00:00Z"),
        ("time", "yesterday"),
        ("hash", "AB" * 32),
        ("prev_hash", "0" * 63),
        ("data", []),
    ],
)
def test_envelope_rejects_bad_fields(field: str, value: Any) -> None:
    (problem,) = validate_envelope({**GOOD_EVENT, field: value})
    assert problem.startswith(f"$.{field}: ")


def test_envelope_requires_every_field_and_nothing_else() -> None:
    record = {k: v for k, v in GOOD_EVENT.items() if k != "cause"} | {"extra": 1}
    assert set(validate_envelope(record)) == {
        "$: missing required field 'cause'",
        "$.extra: unknown field 'extra' (allowed: seq, id, type, schema_version, data, time,"
        " actor, cause, prev_hash, hash)",
    }


# -- the compiled fast check never passes what jsonschema fails -------------------------------


def _valid_documents() -> list[dict[str, Any]]:
    from gitsched import demo

    texts = [demo.CLUSTER, demo.POLICY, *demo.INVENTORY.values(), *demo.JOBS.values()]
    texts += [t for path, t in demo.QUEUES.items() if path.endswith(".yaml")]
    texts += doc_examples()
    found = []
    for text in texts:
        docs, errors = parse_documents(text.encode(), "x.yaml")
        found += [d.data for d in docs if not errors and not validate_document(d)]
    return found


VALID = _valid_documents()
json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-3, 2**40)
    | st.floats(allow_nan=False)
    | st.sampled_from([0, 1, 1.0, 0.5, 8, -1, "", "a", "h100-80g", "nvlink", "required", "Job"])
    | st.text(max_size=6)
)
json_values = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*path, index))
    return found


@st.composite
def mutated_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = json.loads(json.dumps(draw(st.sampled_from(VALID))))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)[1:]))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(json_values)
        else:
            parent[path[-1]] = draw(json_values)
    return doc


@settings(max_examples=1500, deadline=None)
@given(mutated_documents())
def test_the_fast_check_never_passes_a_document_jsonschema_fails(data: dict[str, Any]) -> None:
    from gitsched.schemas.validator import _passes_fast_check, _validator

    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        return
    if _passes_fast_check(kind, data):
        assert [e.message for e in _validator(kind).iter_errors(data)] == []


def test_the_fast_check_passes_valid_documents_and_fails_the_classic_mistakes() -> None:
    from gitsched.schemas.validator import _passes_fast_check

    assert len(VALID) >= 15
    assert all(_passes_fast_check(d["kind"], d) for d in VALID)
    job = next(d for d in VALID if d["kind"] == "Job")
    for wrong in (True, 1.5, "2", None):
        spec = {**job["spec"], "replicas": wrong}
        assert not _passes_fast_check("Job", {**job, "spec": spec}), wrong
    # A `$ref` with a sibling keyword (Draft 7 would ignore the sibling): still enforced.
    cluster = next(d for d in VALID if d["kind"] == "Cluster")
    bad_levels = {**cluster["spec"], "topologyLevels": ["node"]}
    assert validate_document(Document("cluster.yaml", 0, {**cluster, "spec": bad_levels}))
    assert not _passes_fast_check("Cluster", {**cluster, "spec": bad_levels})


def test_topology_level_is_required_unless_unconstrained() -> None:
    assert job("  replicas: 2\n  resources: {gpu: 8}\n  topology: {mode: unconstrained}\n") == []
    assert (
        job(
            "  replicas: 4\n  resources: {gpu: 8}\n  topology: {level: block, sliceSize: 2, sliceLevel: rack}\n"
        )
        == []
    )
    (error,) = job("  replicas: 2\n  resources: {gpu: 8}\n  topology: {mode: preferred}\n")
    assert error.path == "$.spec.topology" and "level" in error.message
    (error,) = job(
        "  replicas: 2\n  resources: {gpu: 8}\n  topology: {level: block, sliceSize: 2}\n"
    )
    assert error.path == "$.spec.topology" and "sliceLevel" in error.message


def test_fair_share_and_idle_reclamation_keys() -> None:
    head = "apiVersion: gitsched.io/v1\nkind: Policy\nmetadata: {name: p}\nspec:\n"
    good = (
        "  fairness: {usageHalfLifeHours: 168}\n"
        "  idle: {enabled: true, thresholdPercent: 10, windowMinutes: 30, graceMinutes: 0,\n"
        "         exemptPriorityClasses: [critical], exemptQueues: [serving], action: reclaim}\n"
    )
    assert check(head + good) == []
    errors = check(
        head + "  fairness: {usageHalfLife: 7d}\n"
        "  idle: {action: kill, thresholdPercent: 101, windowMinutes: 0}\n"
    )
    assert sorted(e.path for e in errors) == [
        "$.spec.fairness.usageHalfLife",
        "$.spec.idle.action",
        "$.spec.idle.thresholdPercent",
        "$.spec.idle.windowMinutes",
    ]


def test_a_queue_sets_its_own_reclaim_within_cohort() -> None:
    """Kueue's ClusterQueue spec.preemption.reclaimWithinCohort, per queue (issue 31)."""
    from gitsched.engine.model import PreemptionScope
    from gitsched.reconciler.specs import _queue

    head = "apiVersion: gitsched.io/v1\nkind: Queue\nmetadata: {name: q}\nspec:\n"
    assert check(head + "  preemption: {reclaimWithinCohort: LowerPriority}\n") == []
    errors = check(head + "  preemption: {reclaimWithinCohort: Sometimes, withinQueue: Never}\n")
    assert sorted(e.path for e in errors) == [
        "$.spec.preemption.reclaimWithinCohort",
        "$.spec.preemption.withinQueue",
    ]
    spec = {"preemption": {"reclaimWithinCohort": "Never"}}
    assert _queue("q", spec, "t").reclaim_within_cohort is PreemptionScope.NEVER
    assert _queue("q", {}, "t").reclaim_within_cohort is None
