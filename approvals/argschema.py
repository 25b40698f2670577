"""Checking edited arguments against a call's JSON Schema (Draft 2020-12).

A schema is checked once, when the call is gated; edited arguments are checked
against it before any decision is written. The first error names the failing
path, so a person can find what to fix.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

__all__ = ["check_schema", "problem"]


def check_schema(schema: dict) -> None:
    """Raise ``ValueError`` when ``schema`` is not a valid Draft 2020-12 JSON Schema."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValueError(f"arguments_schema is not a valid JSON Schema: {exc.message}") from None


def problem(arguments: Any, schema: dict | None) -> str | None:
    """A sentence naming the first path where ``arguments`` fails ``schema``; ``None`` if it
    passes (or there is no schema)."""
    if schema is None:
        return None
    errors = list(Draft202012Validator(schema).iter_errors(arguments))
    if not errors:
        return None
    error = best_match(errors)
    where = error.json_path  # "$" for the object itself, "$.path" for a field
    return f"At {where}: {error.message}"
