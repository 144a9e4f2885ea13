"""YAML that Go's decoder (go.yaml.in/yaml, used by Talos) reads back exactly as written.

PyYAML follows YAML 1.1 and Go's library mostly 1.2, so a few strings (`1e3`, `0o17`) would
read back as numbers in Go. Such strings are double-quoted here, as Go's own encoder does, and
layout follows Go's (4-space indent, sequences indented under their key, no line folding).
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

_SAFE = re.compile(r"^[A-Za-z0-9+/=_.\-]+$")
_NUMBER = re.compile(
    r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"
    r"|^[-+]?(0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*)$"
)
_WORDS = {
    "", "~", "null", "Null", "NULL", "true", "True", "TRUE", "false", "False", "FALSE",
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF",
    ".inf", ".Inf", ".INF", "+.inf", "-.inf", ".nan", ".NaN", ".NAN", "<<",
}


def reads_as_non_string(value: str) -> bool:
    """True when Go's YAML decoder would resolve this plain scalar to a non-string."""
    if value in _WORDS:
        return True
    if not _NUMBER.match(value):
        return False
    try:  # Go's float parser rejects out-of-range exponents, leaving the value a string
        return math.isfinite(float(value.replace("_", "")))
    except ValueError:
        return True  # hex, octal and binary integers


def scalar(value: str) -> str:
    """One string as Go's encoder writes it when it is made of base64/token characters."""
    if _SAFE.match(value) and not reads_as_non_string(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Dumper(yaml.SafeDumper):
    """SafeDumper with Go's sequence indentation."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)

    def ignore_aliases(self, data: Any) -> bool:
        # A value shared between two places must be written twice, never as an &anchor.
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    if reads_as_non_string(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return dumper.represent_str(value)


Dumper.add_representer(str, _represent_str)


def dump(doc: Any) -> str:
    """Deterministic: key order is insertion order, no folding, no timestamps."""
    return yaml.dump(
        doc, Dumper=Dumper, sort_keys=False, indent=4, width=1 << 30, default_flow_style=False, allow_unicode=True
    )
