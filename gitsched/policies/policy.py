"""The effective Policy of a commit: the built-in default overlaid by the repo's files.

The default ships as YAML in `gitsched/policies/library/` so that it reads exactly like the
documents that override it, and is checked by the same schema.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from importlib.resources import files
from typing import Any

from gitsched.schemas import Document, parse_documents, validate_document

_DEFAULT = "default.yaml"


@functools.cache
def _default_spec() -> dict[str, Any]:
    content = files("gitsched.policies").joinpath("library", _DEFAULT).read_bytes()
    docs, errors = parse_documents(content, f"gitsched/policies/library/{_DEFAULT}")
    problems = list(errors) + [e for doc in docs for e in validate_document(doc)]
    if problems or len(docs) != 1 or docs[0].kind != "Policy":
        # The library ships with gitsched: a bad one is our bug, never the user's.
        details = "; ".join(e.format() for e in problems) or "expected one Policy document"
        raise RuntimeError(f"built-in policy library is invalid: {details}")
    spec: dict[str, Any] = docs[0].data["spec"]
    return spec


def default_policy() -> dict[str, Any]:
    """The spec of the built-in default Policy (a fresh copy, safe to change)."""
    return copy.deepcopy(_default_spec())


def merge_policies(docs: Sequence[Document]) -> dict[str, Any]:
    """The default spec, deep-merged with each Policy document's spec in file-name order."""
    merged = default_policy()
    policies = sorted((d for d in docs if d.kind == "Policy"), key=lambda d: (d.file, d.index))
    for doc in policies:
        spec = doc.data.get("spec")
        if isinstance(spec, Mapping):
            merged = _deep_merge(merged, spec)
    return merged


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    # Mappings merge key by key; anything else (lists included) is replaced whole, so a
    # later file can always state a value exactly.
    result = dict(base)
    for key, value in override.items():
        current = result.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            result[key] = _deep_merge(current, value)
        else:
            result[key] = copy.deepcopy(value)
    return result
