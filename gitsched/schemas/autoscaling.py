"""Validation of an `autoscaling` block where a kind embeds it (an InferenceService's
`spec.autoscaling`), against autoscaling.schema.json, with findings at the block's own
file, line and JSON path, in the same words as every other schema error.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib.resources import files
from typing import Any

from jsonschema import Draft202012Validator

from gitsched.findings import Finding
from gitsched.schemas.loader import Document, JsonPath
from gitsched.schemas.validator import _explain, _sorted, embedded_schema

AUTOSCALING_SCHEMA = "autoscaling.schema.json"


@functools.cache
def autoscaling_schema() -> dict[str, Any]:
    """The block's schema (Draft 2020-12), for kinds that `$ref` or inline it."""
    schema: dict[str, Any] = json.loads(
        files("gitsched.schemas").joinpath(AUTOSCALING_SCHEMA).read_text("utf-8")
    )
    return schema


def embedded_autoscaling_schema() -> dict[str, Any]:
    """The block's schema as a plain subschema (schemas.validator.embedded_schema): what a
    kind's `"autoscaling": {"$ref": "autoscaling.schema.json"}` stands for."""
    return copy.deepcopy(embedded_schema(AUTOSCALING_SCHEMA))


@functools.cache
def _validator(at: JsonPath) -> Draft202012Validator:
    # The block's schema nested at its place in the document, so every error's path is
    # the document's.
    nested = embedded_autoscaling_schema()
    for step in reversed(at):
        nested = {"type": "object", "properties": {step: nested}}
    nested["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return Draft202012Validator(nested)


def validate_autoscaling(
    doc: Document, at: JsonPath = ("spec", "autoscaling")
) -> tuple[Finding, ...]:
    """Every problem of the block at `at` in `doc` (none when the block is absent)."""
    seen: set[tuple[JsonPath, int]] = set()
    errors: list[Finding] = []
    for error in _validator(tuple(at)).iter_errors(doc.data):
        errors.extend(_explain(doc, error, seen))
    return _sorted(errors)
