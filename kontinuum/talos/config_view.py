"""A machine config as a flat, secret-free view (`path → value`) that a preview can diff.

The config itself is a secret, so a change of it would read only as "config changed". The view
lists every leaf by its path (`machine.kubelet.extraArgs.max-pods: 110`) with each secret
replaced by a tag, `[secret 1a2b3c4d]`: an HMAC of the value under a key derived from the
cluster's own secrets bundle, so a rotated secret shows as changed (`[secret a…] → [secret b…]`)
while nothing about its value can be learned without the bundle. Secrets are found three ways:
talosctl's own redaction paths and secret-looking key names (kontinuum.talos.redaction), and
any value that contains a string of the bundle (kontinuum.talos.secrets.secret_values). Long
values (certificates, inline manifests) show as their length and a tag.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import yaml

from kontinuum.talos.redaction import REDACTED, redact
from kontinuum.talos.secrets import SecretsBundle, secret_values

LONG = 96  # characters beyond which a value shows as its length and tag


def _key(bundle: SecretsBundle) -> bytes:
    return hashlib.sha256(b"kontinuum config view\0" + bundle.cluster_secret.encode()).digest()


def _tag(key: bytes, value: str) -> str:
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:8]


def _leaves(node: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(node, dict):
        if not node and prefix:
            out[prefix] = "{}"
        for k, v in node.items():
            _leaves(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(node, list):
        if not node and prefix:
            out[prefix] = "[]"
        for i, v in enumerate(node):
            _leaves(v, f"{prefix}[{i}]", out)
    else:
        out[prefix] = node


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def _doc_prefix(doc: dict) -> str:
    if "version" in doc and ("machine" in doc or "cluster" in doc):
        return ""  # the v1alpha1 document: paths as talosctl names them
    return f"{doc.get('kind', 'document')}[{doc.get('name', '')}]." if doc.get("name") else f"{doc.get('kind')}."


def view(config: str | bytes, bundle: SecretsBundle) -> dict[str, str]:
    """path → displayable value of every leaf of every document of the config."""
    text = config.decode() if isinstance(config, bytes) else config
    try:
        raw_docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
        masked_docs = [d for d in yaml.safe_load_all(redact(text)) if isinstance(d, dict)]
    except yaml.YAMLError:
        return {"(config)": "not valid YAML"}
    key, secrets = _key(bundle), [s for s in secret_values(bundle) if len(s) >= 8]
    out: dict[str, str] = {}
    for raw, masked in zip(raw_docs, masked_docs):
        prefix = _doc_prefix(raw)
        values, redacted = {}, {}
        _leaves(raw, "", values)
        _leaves(masked, "", redacted)
        for path, value in values.items():
            shown = _scalar(value)
            if redacted.get(path) == REDACTED and shown != REDACTED or \
                    any(s in shown for s in secrets):
                shown = f"[secret {_tag(key, shown)}]"
            elif len(shown) > LONG or "\n" in shown:
                shown = f"[{len(shown)} chars {_tag(key, shown)}]"
            out[prefix + path] = shown
    return out
