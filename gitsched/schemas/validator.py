"""JSON Schema validation of spec documents, with errors a person can act on.

The Draft 2020-12 schema files beside this module are the contract, usable by other
tools too; this module reports every violation at the line where it was written.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from importlib.resources import files
from typing import Any

import fastjsonschema
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError

from gitsched.findings import Finding
from gitsched.schemas.loader import Document, JsonPath

API_VERSION = "gitsched.io/v1"
KINDS: tuple[str, ...] = (
    "Cluster",
    "Node",
    "NodePool",
    "Queue",
    "Job",
    "Policy",
    "InferenceService",
    "Workspace",
)
ENVELOPE = "Envelope"

_TYPE_WORDS = {
    "integer": "a whole number",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")

# jsonschema checks "date-time" only when an optional package is installed; event times
# must be checked everywhere, so the check is ours.
_FORMATS = FormatChecker()


def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339.match(value):
        return False
    datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    return True


_register: Any = _FORMATS.checks("date-time", raises=ValueError)
_register(_is_date_time)


@functools.cache
def _load(kind: str) -> dict[str, Any]:
    if kind not in KINDS and kind != ENVELOPE:
        known = ", ".join((*KINDS, ENVELOPE))
        raise KeyError(f"no schema for kind {kind!r} (known: {known})")
    schema: dict[str, Any] = _inline(_read(f"{kind.lower()}.schema.json"))
    return schema


def _read(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(files("gitsched.schemas").joinpath(name).read_text("utf-8"))
    return schema


@functools.cache
def embedded_schema(name: str) -> dict[str, Any]:
    """The schema file `name` as a plain subschema, to stand where another schema has
    `{"$ref": name}`: its own "#/$defs/..." references written out, no $schema, $id or
    $defs, so it means the same wherever it sits, for jsonschema and fastjsonschema alike."""
    schema = _read(name)
    defs = schema.pop("$defs", {})
    for key in ("$schema", "$id"):
        schema.pop(key, None)
    local = "#/$defs/"
    expanded: dict[str, Any] = _resolved(
        schema, lambda ref: defs[ref.removeprefix(local)] if ref.startswith(local) else None
    )
    return expanded


def _inline(node: Any) -> Any:
    """`node` with every `{"$ref": "<file>.schema.json", ...}` replaced by that file's
    schema (embedded_schema): one block's schema, kept once, in every kind that has it."""
    return _resolved(
        node, lambda ref: embedded_schema(ref) if ref.endswith(".schema.json") else None
    )


def _resolved(node: Any, target: Callable[[str], Any]) -> Any:
    """`node` with each `{"$ref": r, ...}` whose `target(r)` is a schema replaced by that
    schema (itself resolved the same way) and the node's other keys; a copy throughout."""
    if isinstance(node, list):
        return [_resolved(item, target) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    found = target(ref) if isinstance(ref, str) else None
    if found is not None:
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return {**_resolved(found, target), **rest}
    return {key: _resolved(value, target) for key, value in node.items()}


@functools.cache
def _validator(kind: str) -> Draft202012Validator:
    return Draft202012Validator(_load(kind), format_checker=_FORMATS)


# Schema annotations: words for people, no bearing on what is valid.
_ANNOTATIONS = frozenset(
    {"description", "title", "default", "$comment", "errorMessage", "examples"}
)


def _as_draft_7(node: Any) -> Any:
    """The same constraints in Draft 7 terms: there a `$ref` hides its sibling keywords,
    so a `$ref` beside other constraints becomes an `allOf` of the two."""
    if isinstance(node, list):
        return [_as_draft_7(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _as_draft_7(value) for key, value in node.items()}
    siblings = set(converted) - {"$ref", "$schema", "$id", "$defs"} - _ANNOTATIONS
    if "$ref" in converted and siblings:
        rest = {key: converted.pop(key) for key in sorted(siblings)}
        converted["allOf"] = [{"$ref": converted.pop("$ref")}, rest]
    return converted


@functools.cache
def _fast_check(kind: str) -> Any:
    """The kind's schema compiled to Python by fastjsonschema: about twenty times faster
    than jsonschema, but it only says yes or no. A document it passes has no schema
    error (tests/unit/test_schemas.py checks it never passes one jsonschema fails);
    one it fails goes to jsonschema for every error, in words."""
    schema = _as_draft_7(_load(kind))
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    # use_default=False: by default it writes each `default` into the document it checks.
    return fastjsonschema.compile(schema, formats={"date-time": _is_date_time}, use_default=False)


def _passes_fast_check(kind: str, data: Any) -> bool:
    try:
        _fast_check(kind)(data)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


def schema_for(kind: str) -> dict[str, Any]:
    """The JSON Schema of a kind (or of the stored event `Envelope`); a copy, safe to change."""
    return copy.deepcopy(_load(kind))


def validate_document(doc: Document) -> tuple[Finding, ...]:
    """Every schema violation of one document, sorted by line."""
    data = doc.data
    errors: list[Finding] = []
    api_version = data.get("apiVersion")
    if "apiVersion" not in data:
        errors.append(
            doc.error((), f"missing required field 'apiVersion' (use '{API_VERSION}')", "schema")
        )
    elif api_version != API_VERSION:
        errors.append(
            doc.error(
                ("apiVersion",),
                f"apiVersion must be '{API_VERSION}' (found {_describe(api_version)})",
                "schema",
            )
        )
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        known = ", ".join(KINDS)
        if "kind" not in data:
            message = f"missing field 'kind' (known kinds: {known})"
        else:
            message = (
                f"unknown kind {_describe(kind)}{_did_you_mean(kind, KINDS)} (known kinds: {known})"
            )
        errors.append(doc.error(("kind",) if "kind" in data else (), message, "unknown-kind"))
        return _sorted(errors)

    if _passes_fast_check(kind, data):
        return _sorted(errors)
    seen_required: set[tuple[JsonPath, int]] = set()
    for error in _validator(kind).iter_errors(data):
        errors.extend(_explain(doc, error, seen_required))
    return _sorted(errors)


def validate_envelope(record: Mapping[str, Any]) -> tuple[str, ...]:
    """Problems of one stored event record, as `path: message` lines; empty when valid."""
    doc = Document("<event>", 0, dict(record))
    return tuple(f"{e.path}: {e.message}" for e in _sorted(_envelope_errors(doc)))


def _envelope_errors(doc: Document) -> list[Finding]:
    seen: set[tuple[JsonPath, int]] = set()
    found: list[Finding] = []
    for error in _validator(ENVELOPE).iter_errors(doc.data):
        found.extend(_explain(doc, error, seen))
    return found


def _sorted(errors: list[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(errors, key=lambda e: (e.line or 0, e.column or 0, e.path, e.message)))


def _explain(
    doc: Document, error: ValidationError, seen_required: set[tuple[JsonPath, int]]
) -> list[Finding]:
    """One jsonschema error as Findings in words that do not assume JSON Schema."""
    path: JsonPath = tuple(error.absolute_path)
    keyword = error.validator
    expected: Any = error.validator_value
    instance: Any = error.instance
    schema: Any = error.schema
    found = f" (found {_describe(instance)})"

    if path == ("apiVersion",):
        return []  # reported before schema validation, in words of its own
    if "propertyNames" in error.relative_schema_path and isinstance(instance, str):
        # jsonschema reports a bad key at its mapping; the key's own line is more useful.
        message = _value_message(keyword, expected, instance, schema, found, error.message)
        return [doc.error((*path, instance), f"key {_describe(instance)}: {message}", "schema")]
    if keyword == "additionalProperties" and expected is False and isinstance(instance, dict):
        allowed = list(schema.get("properties", {}))
        patterns = [re.compile(p) for p in schema.get("patternProperties", {})]
        unknown = [
            key
            for key in instance
            if key not in allowed and not any(p.search(key) for p in patterns)
        ]
        return [
            doc.error(
                (*path, key),
                f"unknown field {_describe(key)}{_did_you_mean(key, allowed)}"
                f" (allowed: {', '.join(allowed) or 'none'})",
                "schema",
            )
            for key in unknown
        ]
    if keyword == "required" and isinstance(instance, dict):
        # jsonschema yields one error per missing field; answer all of them at once.
        marker = (path, id(schema))
        if marker in seen_required:
            return []
        seen_required.add(marker)
        missing = [name for name in expected if name not in instance and name != "apiVersion"]
        return [doc.error(path, f"missing required field '{name}'", "schema") for name in missing]
    if keyword == "uniqueItems" and isinstance(instance, list):
        for index, item in enumerate(instance):
            if item in instance[:index]:
                return [
                    doc.error(
                        (*path, index),
                        f"{_describe(item)} is listed more than once; items must be unique",
                        "schema",
                    )
                ]
    message = _value_message(keyword, expected, instance, schema, found, error.message)
    return [doc.error(path, message, "schema")]


def _value_message(
    keyword: str, expected: Any, instance: Any, schema: Any, found: str, fallback: str
) -> str:
    custom = schema.get("errorMessage") if isinstance(schema, dict) else None
    if keyword in ("pattern", "anyOf", "oneOf", "not", "const") and isinstance(custom, str):
        return custom + found
    if keyword == "type":
        kinds = [expected] if isinstance(expected, str) else list(expected)
        message = "must be " + " or ".join(_TYPE_WORDS.get(k, k) for k in kinds) + found
        if "string" in kinds and isinstance(instance, bool | int | float):
            # The classic YAML surprise: `region: no` is false, `version: 1.10` is 1.1.
            message += "; YAML reads unquoted yes/no/on/off and numbers as such, so quote it"
        return message
    if keyword == "enum":
        options = ", ".join(_describe(option) for option in expected)
        hint = _did_you_mean(instance, [o for o in expected if isinstance(o, str)])
        return f"must be one of {options}{found}{hint}"
    if keyword == "const":
        return f"must be {_describe(expected)}{found}"
    if keyword == "minimum":
        return f"must be at least {expected}{found}"
    if keyword == "maximum":
        return f"must be at most {expected}{found}"
    if keyword == "exclusiveMinimum":
        return f"must be greater than {expected}{found}"
    if keyword == "exclusiveMaximum":
        return f"must be less than {expected}{found}"
    if keyword == "minLength":
        return "must not be empty" if expected == 1 else f"must be at least {expected} characters"
    if keyword == "maxLength":
        return f"must be at most {expected} characters (found {len(instance)})"
    if keyword == "minItems":
        return (
            "must list at least one item"
            if expected == 1
            else f"must list at least {expected} items"
        )
    if keyword == "maxItems":
        return f"must list at most {expected} items (found {len(instance)})"
    if keyword == "minProperties":
        return "must not be empty" if expected == 1 else f"must have at least {expected} fields"
    if keyword == "format":
        example = " such as 2024-05-01T12:00:00Z" if expected == "date-time" else ""
        return f"must be a valid {expected}{example}{found}"
    if keyword == "pattern":
        return f"must match the pattern {expected}{found}"
    if keyword in ("anyOf", "oneOf"):
        return f"does not have any of the allowed forms{found}"
    return fallback


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _did_you_mean(word: Any, choices: Any) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""
