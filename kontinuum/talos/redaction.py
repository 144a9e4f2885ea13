"""A machine config with its secrets masked, for previews and diffs.

Masks what talosctl's RedactSecrets masks, plus any value a patch adds under a secret-looking key
(wireguard keys, passwords), so a patched config never shows a secret either.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from kontinuum.talos import goyaml

REDACTED = "******"  # what talosctl's RedactSecrets writes

# Exactly what talosctl's RedactSecrets masks...
_SECRET_PATHS = (
    ("machine", "token"),
    ("machine", "ca", "key"),
    ("cluster", "secret"),
    ("cluster", "token"),
    ("cluster", "aescbcEncryptionSecret"),
    ("cluster", "secretboxEncryptionSecret"),
    ("cluster", "serviceAccount", "key"),
    ("cluster", "ca", "key"),
    ("cluster", "aggregatorCA", "key"),
    ("cluster", "etcd", "ca", "key"),
)
# ...plus anything a patch adds whose key name says it is secret (wireguard keys, passwords).
_SECRET_KEY = re.compile(r"(^|[a-z])(key|Key|token|Token|secret|Secret|password|Password|passphrase)$")
_NOT_SECRET = {"publicKey", "publickey", "crt"}


def _mask(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            secret_name = isinstance(k, str) and k not in _NOT_SECRET and _SECRET_KEY.search(k)
            if secret_name and isinstance(v, (str, bytes)) and v:
                out[k] = REDACTED
            else:
                out[k] = _mask(v)
        return out
    if isinstance(node, list):
        return [_mask(v) for v in node]
    return node


def _mask_path(doc: Any, path: tuple[str, ...]) -> None:
    for key in path[:-1]:
        if not isinstance(doc, dict) or not isinstance(doc.get(key), dict):
            return
        doc = doc[key]
    if isinstance(doc, dict) and doc.get(path[-1]):
        doc[path[-1]] = REDACTED


def redact(config: bytes | str) -> str:
    """The config with every secret replaced by `******`, for previews and diffs."""
    text = config.decode() if isinstance(config, bytes) else config
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:  # PyYAML quotes the offending line, which may hold a secret
        raise ValueError(f"config is not valid YAML ({exc.__class__.__name__})") from None
    out = []
    for doc in docs:
        doc = _mask(doc)
        for path in _SECRET_PATHS:
            _mask_path(doc, path)
        out.append(goyaml.dump(doc))
    return "---\n".join(out)
