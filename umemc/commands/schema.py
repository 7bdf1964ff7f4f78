"""`umemc schema`: print the stack file's JSON Schema (schema/stack.schema.json is this output)."""

from __future__ import annotations

import argparse
import json

from .common import write_stdout


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("schema", help="print the JSON Schema of stack files")
    p.set_defaults(func=run)


def schema_text() -> str:
    from ..stack.models import Stack

    schema = Stack.model_json_schema(mode="validation")
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def run(ns: argparse.Namespace) -> int:  # takes no argument
    write_stdout(schema_text())
    return 0
