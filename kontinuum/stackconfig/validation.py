"""The whole stack-config check, shared by the program (before anything is registered) and
`python -m kontinuum check` (no engine): the contract, the zones' own checks, and every pool's
rendered machine config judged by us and by Talos's validator."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kontinuum.errors import ConfigError
from kontinuum.stackconfig import contract, render_check, specs
from kontinuum.stackconfig.model import StackConfig
from kontinuum.stackconfig.parse import SECRET_PLACEHOLDER, problems


@dataclass
class Result:
    stack: StackConfig | None
    errors: list[ConfigError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    configs: int = 0
    validator_seconds: float = 0.0

    def message(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def from_engine(values: dict[str, Any]) -> dict:
    """`kontinuum:*` values as the engine hands them over (strings, JSON for structured ones)."""
    raw = {}
    for key, value in values.items():
        namespace, _, name = key.partition(":")
        if namespace != contract.NAMESPACE or not name:
            continue
        f = contract.STACK.fields.get(name)
        if isinstance(value, str) and (f is None or f.type != "string"):
            try:
                value = json.loads(value)
            except ValueError:
                pass  # left a string: the contract says what it should have been
        raw[name] = value
    return raw


def read_stack_file(path: Path) -> tuple[dict, frozenset[str]]:
    """`kontinuum:*` keys of a Pulumi.<stack>.yaml, and which of them are `secure:` values."""
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:  # its text quotes the line, which may hold a secret: the place only
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError("", f"not valid YAML{where}") from None
    values = doc.get("config") or {} if isinstance(doc, dict) else {}
    if not isinstance(values, dict):
        raise ConfigError("config", "must be a mapping of `kontinuum:<key>: value`")
    raw, secret = {}, set()
    for key, value in values.items():
        namespace, _, name = str(key).partition(":")
        if namespace != contract.NAMESPACE or not name:
            continue
        raw[name] = _unwrap_secure(value, name, secret)
    return raw, frozenset(secret)


def _unwrap_secure(value: Any, path: str, secret: set[str]) -> Any:
    """`{secure: …}` values, at any depth (`pulumi config set --secret --path`), become the
    placeholder; their paths (`zones[0].flux.credentials.git.token`) are recorded as secret."""
    if isinstance(value, dict) and set(value) == {"secure"}:
        secret.add(path)
        return SECRET_PLACEHOLDER
    if isinstance(value, dict):
        return {k: _unwrap_secure(v, f"{path}.{k}", secret) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap_secure(v, f"{path}[{i}]", secret) for i, v in enumerate(value)]
    return value


def validate(raw: dict, *, secret_keys: frozenset[str] | None, render: bool = True,
             validator: str | None = None) -> Result:
    """Every problem at once; `render` also renders and judges each pool's machine config."""
    stack, errors = problems(raw, secret_keys=secret_keys)
    result = Result(stack, list(errors))
    if stack is None:
        return result
    seen = {str(e) for e in errors}
    for i, z in zip(stack.zone_index, stack.zones):
        try:
            specs.validate(f"{stack.region}-{z.zone}", z, f"zones[{i}].")
        except ConfigError as exc:
            for e in getattr(exc, "errors", [exc]):
                if str(e) not in seen:
                    seen.add(str(e))
                    result.errors.append(e)
    if render:
        # A zone with problems of its own (or any in `defaults`) had bad parts dropped: render
        # only the others, so what Talos says is never about a value we already refused.
        bad = {str(e.path) for e in result.errors}
        skip = {i for i in stack.zone_index if any(p.startswith((f"zones[{i}]", "defaults")) for p in bad)}
        report = render_check.check(stack, raw, validator=validator, skip=skip)
        result.errors += report.errors
        result.notes += report.notes
        result.configs, result.validator_seconds = report.configs, report.validator_seconds
    return result
