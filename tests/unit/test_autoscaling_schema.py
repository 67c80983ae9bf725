"""The `autoscaling` block's schema (schemas/autoscaling.schema.json): bad input is a
finding at its file, line and JSON path; a good block passes and parses."""

from __future__ import annotations

import textwrap

import pytest
from jsonschema import Draft202012Validator

from gitsched.engine.autoscaling import DEFAULT_TOLERANCE, parse_autoscaling
from gitsched.schemas.autoscaling import autoscaling_schema, validate_autoscaling
from gitsched.schemas.loader import parse_documents

GOOD = """\
apiVersion: gitsched.io/v1
kind: InferenceService
metadata:
  name: chat
spec:
  autoscaling:
    metric:
      query: 'sum(vllm:num_requests_waiting{service="ml/chat"})'
    target: 8
    tolerance: 0.1
    scaleUp:
      stabilizationWindowSeconds: 0
      selectPolicy: Max
      policies:
        - {type: Percent, value: 100, periodSeconds: 15}
        - {type: Pods, value: 4, periodSeconds: 15}
    scaleDown:
      stabilizationWindowSeconds: 300
      policies:
        - {type: Percent, value: 100, periodSeconds: 15}
"""


def findings(text: str):  # type: ignore[no-untyped-def]
    docs, problems = parse_documents(textwrap.dedent(text).encode(), "teams/ml/services/chat.yaml")
    assert not problems
    [doc] = docs
    return validate_autoscaling(doc)


def test_the_schema_is_valid_draft_2020_12() -> None:
    Draft202012Validator.check_schema(autoscaling_schema())


def test_a_good_block_passes_and_parses() -> None:
    assert findings(GOOD) == ()
    docs, _ = parse_documents(GOOD.encode(), "f.yaml")
    spec = parse_autoscaling(docs[0].data["spec"]["autoscaling"])
    assert spec.target == 8.0 and spec.tolerance == DEFAULT_TOLERANCE
    assert spec.scale_down.select_policy == "Max"


def test_no_block_is_no_finding() -> None:
    assert findings("kind: InferenceService\nspec: {replicas: {min: 1}}\n") == ()


@pytest.mark.parametrize(
    ("change", "line", "path", "message"),
    [
        ("    target: 8", "    target: 0", "$.spec.autoscaling.target", "must be greater than 0"),
        ("    target: 8", "    target: -2", "$.spec.autoscaling.target", "must be greater than 0"),
        ("    target: 8", "    target: '8'", "$.spec.autoscaling.target", "must be a number"),
        (
            "      query: 'sum(vllm:num_requests_waiting{service=\"ml/chat\"})'",
            "      query: 42",
            "$.spec.autoscaling.metric.query",
            "must be a string",
        ),
        (
            "      query: 'sum(vllm:num_requests_waiting{service=\"ml/chat\"})'",
            "      query: [up]",
            "$.spec.autoscaling.metric.query",
            "must be a string",
        ),
        ("    tolerance: 0.1", "    tolerance: 1.5", "$.spec.autoscaling.tolerance", "less than 1"),
        (
            "    tolerance: 0.1",
            "    tolerence: 0.1",
            "$.spec.autoscaling.tolerence",
            "unknown field 'tolerence'; did you mean 'tolerance'?",
        ),
        (
            "      selectPolicy: Max",
            "      selectPolicy: Maximum",
            "$.spec.autoscaling.scaleUp.selectPolicy",
            "must be one of 'Max', 'Min', 'Disabled'",
        ),
        (
            "      stabilizationWindowSeconds: 300",
            "      stabilizationWindowSeconds: 7200",
            "$.spec.autoscaling.scaleDown.stabilizationWindowSeconds",
            "must be at most 3600",
        ),
        (
            "        - {type: Pods, value: 4, periodSeconds: 15}",
            "        - {type: Pods, value: 0, periodSeconds: 15}",
            "$.spec.autoscaling.scaleUp.policies[1].value",
            "must be at least 1",
        ),
        (
            "        - {type: Pods, value: 4, periodSeconds: 15}",
            "        - {type: Pod, value: 4, periodSeconds: 15}",
            "$.spec.autoscaling.scaleUp.policies[1].type",
            "did you mean 'Pods'",
        ),
        (
            "        - {type: Pods, value: 4, periodSeconds: 15}",
            "        - {type: Pods, value: 4, periodSeconds: 15, every: 2}",
            "$.spec.autoscaling.scaleUp.policies[1].every",
            "unknown field 'every'",
        ),
    ],
)
def test_bad_input_is_a_finding_at_its_line_and_path(
    change: str, line: str, path: str, message: str
) -> None:
    assert change in GOOD
    text = GOOD.replace(change, line, 1)
    [found] = findings(text)
    assert found.path == path
    assert message in found.message
    assert found.file == "teams/ml/services/chat.yaml"
    # The line where the bad value (or the bad key) was written.
    assert found.line == text.splitlines().index(line) + 1


def test_a_block_without_metric_or_target_says_both_are_missing() -> None:
    text = "kind: InferenceService\nspec:\n  autoscaling:\n    tolerance: 0.2\n"
    got = findings(text)
    assert {(f.path, f.message) for f in got} == {
        ("$.spec.autoscaling", "missing required field 'metric'"),
        ("$.spec.autoscaling", "missing required field 'target'"),
    }
    assert all(f.line == 3 for f in got)


def test_a_block_that_is_no_mapping_is_a_finding() -> None:
    [found] = findings("kind: InferenceService\nspec:\n  autoscaling: yes\n")
    assert found.path == "$.spec.autoscaling" and "must be a mapping" in found.message


def test_the_embedded_block_schema_means_the_same_to_fastjsonschema() -> None:
    # What a kind's schema inlines (schemas.autoscaling.embedded_autoscaling_schema) must
    # compile for the validator's fast path too, and agree with jsonschema on every case.
    import fastjsonschema

    from gitsched.schemas.autoscaling import embedded_autoscaling_schema

    embedded = embedded_autoscaling_schema()
    assert "$ref" not in str(embedded) and "$defs" not in embedded
    check = fastjsonschema.compile(
        {"$schema": "http://json-schema.org/draft-07/schema#", **embedded}, use_default=False
    )
    docs, _ = parse_documents(GOOD.encode(), "f.yaml")
    good = docs[0].data["spec"]["autoscaling"]
    check(good)
    for bad in (
        {**good, "target": 0},
        {**good, "metric": {"query": 1}},
        {**good, "extra": 1},
        {**good, "scaleDown": {"policies": []}},
        {**good, "scaleUp": {"selectPolicy": "max"}},
    ):
        with pytest.raises(fastjsonschema.JsonSchemaException):
            check(bad)
        assert list(Draft202012Validator(embedded).iter_errors(bad))
