"""Spec files in, JSON-compatible documents and located errors (`findings.Finding`) out.

Everything a commit's YAML must satisfy on its own (syntax, safety limits, the JSON
Schema of its kind) lives here; rules across documents live in `policies`.
"""

from gitsched.schemas.loader import Document, JsonPath, Limits, format_json_path, parse_documents
from gitsched.schemas.validator import (
    API_VERSION,
    ENVELOPE,
    KINDS,
    schema_for,
    validate_document,
    validate_envelope,
)

__all__ = [
    "API_VERSION",
    "ENVELOPE",
    "KINDS",
    "Document",
    "JsonPath",
    "Limits",
    "format_json_path",
    "parse_documents",
    "schema_for",
    "validate_document",
    "validate_envelope",
]
