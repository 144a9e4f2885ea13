"""One definition of the stack config: the README table and the shipped JSON Schema are
generated from kontinuum/stackconfig/contract.py and must not drift from it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from kontinuum.cli import schema as schema_cli
from kontinuum.stackconfig import contract

ROOT = Path(__file__).parents[2]


def test_readme_table_is_the_contract():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- stack-config-table:[^>]*-->\n(.*?)\n<!-- end of stack-config-table -->", readme, re.S)
    assert block, "README lost its generated stack-config table"
    assert block.group(1) == schema_cli.markdown(), "regenerate: python -m kontinuum schema --markdown"


def test_shipped_json_schema_is_the_contract():
    shipped = json.loads((ROOT / "stacks" / "kontinuum.schema.json").read_text())
    assert shipped == schema_cli.stack_file_schema(), "regenerate: python -m kontinuum schema > stacks/kontinuum.schema.json"


def test_json_schema_knows_every_key_of_the_shipped_stacks_and_refuses_others():
    props = schema_cli.stack_file_schema()["properties"]["config"]["properties"]
    assert set(props) == {f"kontinuum:{k}" for k in contract.STACK.fields}
    zone = props["kontinuum:zones"]["items"]
    assert zone["additionalProperties"] is False and "talosVersion" in zone["properties"]
    for path in (ROOT / "stacks").glob("Pulumi.*.yaml"):
        text = path.read_text()
        assert text.startswith("# yaml-language-server: $schema=kontinuum.schema.json"), path
        for key in yaml.safe_load(text)["config"]:
            assert key in props, (path, key)


def test_json_schema_patterns_accept_the_shipped_values():
    """Every `pattern` on the way to a shipped stack's value matches it (the Python check is the
    precise one; the patterns must never refuse what it accepts)."""
    kinds = {"string": str, "object": dict, "array": list}

    def walk(node, value):
        if not isinstance(node, dict):
            return
        for option in node.get("anyOf", []):
            if kinds.get(option.get("type")) is type(value):
                walk(option, value)
        if "pattern" in node and isinstance(value, str):
            assert re.search(node["pattern"], value), (node["pattern"], value)
        if isinstance(value, dict):
            for key, sub in value.items():
                walk((node.get("properties") or {}).get(key) or node.get("additionalProperties"), sub)
        if isinstance(value, list):
            for item in value:
                walk(node.get("items"), item)

    for path in (ROOT / "stacks").glob("Pulumi.*.yaml"):
        walk(schema_cli.stack_file_schema()["properties"]["config"], yaml.safe_load(path.read_text())["config"])
