"""A tiny schema language: one definition of the stack config gives the validator (shapes,
unknown keys with a suggestion, value formats), the JSON Schema editors use and the README
table. The contract itself is in contract.py; this module knows nothing about Kontinuum.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from kontinuum.errors import ConfigError

_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "string": ("a string", lambda v: isinstance(v, str)),
    "integer": ("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "number": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "boolean": ("true or false", lambda v: isinstance(v, bool)),
    "object": ("a mapping", lambda v: isinstance(v, dict)),
    "array": ("a list", lambda v: isinstance(v, list)),
}


@dataclass(frozen=True)
class Format:
    """A value check: `problem(value)` says what is wrong (or None); `pattern` is the closest
    regular expression for the JSON Schema (the Python check is the precise one)."""

    name: str
    problem: Callable[[Any], str | None]
    pattern: str | None = None


@dataclass(frozen=True)
class Field:
    type: str  # a key of _TYPES, "any", or "union" (one of `options`, chosen by the value's type)
    doc: str = ""
    default: Any = None
    required: bool = False
    fields: dict[str, "Field"] | None = None  # object: its known keys
    values: "Field | None" = None  # object with free keys (labels, chart values): each value's shape
    items: "Field | None" = None  # array: each item's shape
    options: tuple["Field", ...] = ()
    enum: tuple | None = None
    minimum: float | None = None
    maximum: float | None = None
    format: Format | None = None
    secret: bool = False
    doc_default: str | None = None  # how the README shows a default computed elsewhere
    expand: bool = True  # the README lists this object's keys (False: they are documented elsewhere)


def Str(doc: str = "", **kw) -> Field:  # noqa: N802 - reads as a type in the contract
    return Field("string", doc, **kw)


def Int(doc: str = "", **kw) -> Field:  # noqa: N802
    return Field("integer", doc, **kw)


def Num(doc: str = "", **kw) -> Field:  # noqa: N802
    return Field("number", doc, **kw)


def Bool(doc: str = "", **kw) -> Field:  # noqa: N802
    return Field("boolean", doc, **kw)


def Obj(fields: dict[str, Field], doc: str = "", **kw) -> Field:  # noqa: N802
    return Field("object", doc, fields=fields, **kw)


def Map(values: Field, doc: str = "", **kw) -> Field:  # noqa: N802
    return Field("object", doc, values=values, **kw)


def List(items: Field, doc: str = "", **kw) -> Field:  # noqa: N802
    return Field("array", doc, items=items, **kw)


def OneOf(*options: Field, doc: str = "", **kw) -> Field:  # noqa: N802
    return Field("union", doc, options=options, **kw)


ANY = Field("any")


def without(obj: Field, *keys: str, **kw) -> Field:
    """The same object shape minus some keys (e.g. `defaults` = a zone without its name)."""
    assert obj.fields is not None
    return replace(obj, fields={k: v for k, v in obj.fields.items() if k not in keys}, **kw)


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value[:60]!r})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else type(value).__name__


def _expected(f: Field) -> str:
    if f.type == "union":
        return " or ".join(_expected(o) for o in f.options)
    return _TYPES[f.type][0] if f.type in _TYPES else "a value"


def suggest(key: str, known: list[str]) -> str:
    """`did you mean X?` for a near miss, else the list of known keys."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6) or difflib.get_close_matches(
        key.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
    if close:
        match = next(k for k in known if k.lower() == close[0].lower())
        return f"unknown key; did you mean {match}?"
    return f"unknown key; known: {', '.join(known)}"


def check(f: Field, value: Any, path: str, errors: list[ConfigError]) -> Any:
    """Check `value` against `f`, appending every problem; returns the value with each bad
    part dropped (so later semantic checks see only well-shaped data and defaults)."""
    if f.type == "any":
        return value
    if f.type == "union":
        for option in f.options:
            if option.type == "any" or _TYPES[option.type][1](value):
                return check(option, value, path, errors)
        errors.append(ConfigError(path, f"must be {_expected(f)}, got {_describe(value)}"))
        return None
    words, test = _TYPES[f.type]
    if not test(value):
        got = "a value of another type" if f.secret else _describe(value)  # never quote a secret
        errors.append(ConfigError(path, f"must be {words}, got {got}"))
        return None
    if f.enum is not None and value not in f.enum:
        choices = [str(c) for c in f.enum]
        errors.append(ConfigError(path, f"must be {', '.join(choices[:-1])} or {choices[-1]}, got {value!r}"))
        return None
    if f.minimum is not None and value < f.minimum or f.maximum is not None and value > f.maximum:
        bound = f">= {f.minimum:g}" if f.maximum is None else f"between {f.minimum:g} and {f.maximum:g}"
        errors.append(ConfigError(path, f"must be {words} {bound}, got {value!r}"))
        return None
    if f.format is not None:
        problem = f.format.problem(value)
        if problem:
            errors.append(ConfigError(path, problem if f.secret else f"{problem}, got {value!r}"))
            return None
    if f.type == "array":
        return [v for i, item in enumerate(value)
                if (v := check(f.items, item, f"{path}[{i}]", errors)) is not None] if f.items else value
    if f.type == "object":
        return _check_object(f, value, path, errors)
    return value


def _check_object(f: Field, value: dict, path: str, errors: list[ConfigError]) -> dict:
    prefix = f"{path}." if path else ""
    out = {}
    if f.fields is None:
        for key, item in value.items():
            checked = check(f.values, item, f"{prefix}{key}", errors) if f.values else item
            if checked is not None:
                out[key] = checked
        return out
    for key, item in value.items():
        sub = f.fields.get(key) if isinstance(key, str) else None
        if sub is None:
            errors.append(ConfigError(f"{prefix}{key}", suggest(str(key), list(f.fields))))
            continue
        if item is None:  # YAML's empty value: as if unset
            continue
        checked = check(sub, item, f"{prefix}{key}", errors)
        if checked is not None:
            out[key] = checked
    for key, sub in f.fields.items():
        if sub.required and value.get(key) is None:
            errors.append(ConfigError(f"{prefix}{key}", "required"))
    return out


# --- outputs: JSON Schema and the README table -------------------------------------------


def json_schema(f: Field) -> dict:
    """Draft 2020-12 JSON Schema of one field (objects closed: unknown keys are errors). A
    secret is stored encrypted (`pulumi config set --secret [--path]`): `{secure: …}` in the file."""
    if f.secret:
        return {"type": "object", "properties": {"secure": {"type": "string"}}, "required": ["secure"],
                "additionalProperties": False, "description": f.doc}
    if f.type == "any":
        out: dict = {}
    elif f.type == "union":
        out = {"anyOf": [json_schema(o) for o in f.options]}
    else:
        out = {"type": f.type}
    if f.doc:
        out["description"] = f.doc
    if f.default is not None:
        out["default"] = f.default
    if f.enum is not None:
        out["enum"] = list(f.enum)
    if f.minimum is not None:
        out["minimum"] = f.minimum
    if f.maximum is not None:
        out["maximum"] = f.maximum
    if f.format is not None and f.format.pattern:
        out["pattern"] = f.format.pattern
    if f.items is not None:
        out["items"] = json_schema(f.items)
    if f.fields is not None:
        out["properties"] = {k: json_schema(v) for k, v in f.fields.items()}
        out["additionalProperties"] = False
        required = [k for k, v in f.fields.items() if v.required]
        if required:
            out["required"] = required
    elif f.values is not None:
        out["additionalProperties"] = json_schema(f.values)
    return out


def rows(f: Field, path: str = "", *, every: bool = False) -> Iterator[tuple[str, Field]]:
    """(path, field) for every documented key, depth first, as the README table lists them;
    every=True: every key of the contract, documented in a row or not (for tests)."""
    if f.type == "union":
        for option in f.options:
            yield from rows(option, path, every=every)
        return
    if f.fields is not None:
        for key, sub in f.fields.items():
            sub_path = f"{path}.{key}" if path else key
            if sub.doc or every:
                yield sub_path, sub
            if sub.expand or every:
                yield from rows(sub, sub_path, every=every)
    elif f.items is not None and (f.items.expand or every):
        yield from rows(f.items, f"{path}[]", every=every)


def default_text(f: Field) -> str:
    if f.doc_default is not None:
        return f.doc_default
    if f.default is None:
        return ""
    if isinstance(f.default, bool):
        return "true" if f.default else "false"
    return f"`{f.default}`" if not isinstance(f.default, (dict, list)) else ""


def shape_text(f: Field) -> str:
    if f.enum is not None:
        return " \\| ".join(f"`{v}`" for v in f.enum)
    if f.type == "union":
        return " or ".join(shape_text(o) for o in f.options)
    base = {"string": "string", "integer": "integer", "number": "number", "boolean": "bool", "object": "mapping",
            "array": "list", "any": "any"}[f.type]
    if f.format is not None:
        base = f.format.name
    if f.minimum is not None and f.type in ("integer", "number"):
        base += f" ≥ {f.minimum:g}" if f.maximum is None else f" {f.minimum:g}–{f.maximum:g}"
    return base


def markdown_table(f: Field, key_prefix: str = "") -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for path, sub in rows(f):
        doc = sub.doc.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{key_prefix}{path}` | {shape_text(sub)} | {default_text(sub)} | {doc} |")
    return "\n".join(lines)


def walk_docs(f: Field) -> Iterator[Field]:
    yield f
    for sub in (f.fields or {}).values():
        yield from walk_docs(sub)
    for sub in (f.items, f.values, *f.options):
        if sub is not None:
            yield from walk_docs(sub)

