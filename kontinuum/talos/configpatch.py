"""Machine-config patches from stack config: RFC 6902 JSON patches and Talos-style merge patches.

Both work on the plain-data form of a config (dicts, lists, scalars) and never mutate their
input, so rendering stays a pure function. Errors carry the stack-config path of the patch.
"""

from __future__ import annotations

import copy
from typing import Any, Union

import yaml

from kontinuum.errors import ConfigError

Patch = Union[list, dict, str]
"""A list of JSON-patch ops, a merge-patch mapping, or YAML text of either."""

# Talos replaces these lists on merge instead of appending to them (`merge:"replace"` tags in
# the v1alpha1 types); an appended pod subnet would silently create a dual-stack cluster.
REPLACE_PATHS = frozenset(
    {
        ("cluster", "network", "podSubnets"),
        ("cluster", "network", "serviceSubnets"),
        ("cluster", "apiServer", "auditPolicy"),
    }
)
_DELETE = {"$patch": "delete"}


def normalize(patch: Patch, where: str) -> list | dict:
    """Accept YAML text too, and reject anything that is neither patch kind up front."""
    if isinstance(patch, str):
        try:
            patch = yaml.safe_load(patch)
        except yaml.YAMLError as exc:
            raise ConfigError(where, f"patch is not valid YAML ({exc.__class__.__name__})") from None
    if isinstance(patch, dict):
        return patch
    if isinstance(patch, list):
        for i, op in enumerate(patch):
            _check_op(op, f"{where}[{i}]")
        return patch
    raise ConfigError(where, "patch must be a list of JSON-patch operations or a mapping (merge patch)")


def apply(doc: dict, patch: Patch, where: str) -> dict:
    """Apply one patch of either kind and return a new document."""
    patch = normalize(patch, where)
    if isinstance(patch, dict):
        return merge(doc, patch)
    return json_patch(doc, patch, where)


# --- merge ----------------------------------------------------------------------------------


def merge(left: Any, right: Any, path: tuple[str, ...] = ()) -> Any:
    """Talos merge semantics: mappings merge key by key, lists append (except the few Talos
    replaces), scalars from the patch win, null leaves a value alone, and a `{$patch: delete}`
    value removes the key."""
    if isinstance(left, dict) and isinstance(right, dict):
        out = copy.deepcopy(left)
        for key, value in right.items():
            if value == _DELETE:
                out.pop(key, None)
            elif value is None:
                continue
            elif key in out and (path + (key,)) not in REPLACE_PATHS:
                out[key] = merge(out[key], value, path + (key,))
            else:
                out[key] = _strip_directives(copy.deepcopy(value))
        return out
    if isinstance(left, list) and isinstance(right, list):
        return copy.deepcopy(left) + _strip_directives(copy.deepcopy(right))
    return _strip_directives(copy.deepcopy(right))


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if v != _DELETE}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


# --- RFC 6902 -------------------------------------------------------------------------------

_OPS = {"add": ("value",), "remove": (), "replace": ("value",), "move": ("from",), "copy": ("from",), "test": ("value",)}


def _check_op(op: Any, where: str) -> None:
    if not isinstance(op, dict):
        raise ConfigError(where, "JSON-patch operation must be a mapping with op and path")
    name = op.get("op")
    if name not in _OPS:
        raise ConfigError(f"{where}.op", f"must be one of {', '.join(_OPS)}, got {name!r}")
    for member in ("path",) + _OPS[name]:
        if member not in op:
            raise ConfigError(f"{where}.{member}", f"is required for {name!r}")
    for member in ("path", "from"):
        if member in op and not (isinstance(op[member], str) and (op[member] == "" or op[member].startswith("/"))):
            raise ConfigError(f"{where}.{member}", f"must be a JSON pointer starting with '/', got {op[member]!r}")


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _index(container: list, token: str, *, allow_end: bool, pointer: str) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise KeyError(f"{pointer}: {token!r} is not a list index")
    i = int(token)
    if i > len(container) or (i == len(container) and not allow_end):
        raise KeyError(f"{pointer}: index {i} is out of range")
    return i


def _walk(doc: Any, tokens: list[str], pointer: str) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise KeyError(f"{pointer}: {token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False, pointer=pointer)]
        else:
            raise KeyError(f"{pointer}: cannot descend into a scalar")
    return node


def _get(doc: Any, pointer: str) -> Any:
    return _walk(doc, _tokens(pointer), pointer)


def _add(doc: Any, pointer: str, value: Any) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return value
    parent = _walk(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True, pointer=pointer), value)
    else:
        raise KeyError(f"{pointer}: parent is a scalar")
    return doc


def _remove(doc: Any, pointer: str) -> tuple[Any, Any]:
    tokens = _tokens(pointer)
    if not tokens:
        raise KeyError("cannot remove the whole document")
    parent = _walk(doc, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise KeyError(f"{pointer}: {last!r} does not exist")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, allow_end=False, pointer=pointer))
    raise KeyError(f"{pointer}: parent is a scalar")


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    return a == b


def json_patch(doc: Any, ops: list, where: str) -> Any:
    """Apply RFC 6902 operations atomically: either all apply or a ConfigError names the op."""
    out = copy.deepcopy(doc)
    for i, op in enumerate(ops):
        op_where = f"{where}[{i}]"
        _check_op(op, op_where)
        name, path = op["op"], op["path"]
        try:
            if name == "add":
                out = _add(out, path, copy.deepcopy(op["value"]))
            elif name == "remove":
                out, _ = _remove(out, path)
            elif name == "replace":
                _get(out, path)
                if path == "":
                    out = copy.deepcopy(op["value"])
                else:
                    out, _ = _remove(out, path)
                    out = _add(out, path, copy.deepcopy(op["value"]))
            elif name == "move":
                if path == op["from"] or path.startswith(op["from"] + "/"):
                    raise KeyError(f"{path}: cannot move a value into itself")
                out, value = _remove(out, op["from"])
                out = _add(out, path, value)
            elif name == "copy":
                out = _add(out, path, copy.deepcopy(_get(out, op["from"])))
            elif name == "test":
                if not _json_equal(_get(out, path), op["value"]):
                    raise KeyError(f"{path}: value differs from the expected one")
        except KeyError as exc:
            raise ConfigError(op_where, f"{name} failed: {exc.args[0]}") from None
    return out
