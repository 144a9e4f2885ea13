"""`python -m kontinuum schema [--markdown]`: the stack config contract as JSON Schema (for
editors checking Pulumi.<stack>.yaml; shipped as stacks/kontinuum.schema.json) or as the
README's table. Both come from kontinuum/stackconfig/contract.py."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--markdown", action="store_true", help="the README table instead of JSON Schema")


def stack_file_schema() -> dict:
    """JSON Schema of a whole Pulumi.<stack>.yaml: `config:` holds the `kontinuum:*` keys."""
    from kontinuum.stackconfig import contract, schema

    keys = schema.json_schema(contract.STACK)  # secrets, at any depth, as `{secure: …}`
    config = {f"{contract.NAMESPACE}:{k}": v for k, v in keys["properties"].items()}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Kontinuum stack config (stacks/Pulumi.<stack>.yaml)",
        "type": "object",
        "properties": {
            "config": {"type": "object", "properties": config,
                       "required": [f"{contract.NAMESPACE}:{k}" for k in keys.get("required", [])],
                       "patternProperties": {f"^(?!{contract.NAMESPACE}:)": {}},
                       "additionalProperties": False},
            "encryptionsalt": {"type": "string"},
            "secretsprovider": {"type": "string"},
            "encryptedkey": {"type": "string"},
        },
    }


def markdown() -> str:
    from kontinuum.stackconfig import contract, schema

    return schema.markdown_table(contract.STACK)


def run(args: argparse.Namespace) -> int:
    print(markdown() if args.markdown else json.dumps(stack_file_schema(), indent=2, ensure_ascii=False))
    return 0
