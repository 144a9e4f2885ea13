"""talosconfig files and the client certificates inside them.

The layout matches talosctl's (`context`, `contexts.<name>.{endpoints,nodes,ca,crt,key}`, PEM
text base64-encoded), so the file we hand out works with talosctl and theirs works with us.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from dataclasses import dataclass, field

import yaml

from kontinuum.errors import ConfigError
from kontinuum.talos import goyaml, pki
from kontinuum.talos.pki import CertKey

APID_PORT = 50000  # apid's port: what an endpoint without one means

ROLES = ("os:admin", "os:operator", "os:reader", "os:etcd:backup", "os:impersonator")
CLIENT_CERT_DAYS = 365  # talosctl: TalosAPIDefaultCertificateValidityDuration


@dataclass
class TalosConfig:
    """One resolved context of a talosconfig, PEM bytes decoded."""

    context: str
    endpoints: list[str]
    nodes: list[str] = field(default_factory=list)
    ca: bytes = b""
    crt: bytes = b""
    key: bytes = b""

    def __repr__(self) -> str:
        return f"TalosConfig(context={self.context!r}, endpoints={self.endpoints!r}, nodes={self.nodes!r}, <certs>)"


def issue_client_cert(os_ca: CertKey, role: str = "os:admin", now: dt.datetime | None = None,
                      lifetime: dt.timedelta | None = None) -> CertKey:
    """Client certificate as `talosctl gen config` issues it: Ed25519, Organization=role, no CN,
    EKU exactly ClientAuth (apid rejects anything else when apidCheckExtKeyUsage is on)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return pki.issue_cert(
        os_ca, organizations=[role], client=True, days=CLIENT_CERT_DAYS, key_type="ed25519", now=now,
        lifetime=lifetime)


_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+=\-]*$")


def _scalar(value: str) -> str:
    """Plain when both PyYAML and Go read it back as the same string, JSON-quoted otherwise."""
    if _PLAIN.match(value) and yaml.safe_load(value) == value and not goyaml.reads_as_non_string(value):
        return value
    return json.dumps(value)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def render(context: str, endpoints: list[str], nodes: list[str], ca_crt: bytes, client: CertKey) -> str:
    """A talosconfig with one context, indented like talosctl writes it."""
    if not context:
        raise ValueError("context name is required")
    if not endpoints:
        raise ValueError("at least one endpoint is required")
    lines = [f"context: {_scalar(context)}", "contexts:", f"    {_scalar(context)}:", "        endpoints:"]
    lines += [f"            - {_scalar(e)}" for e in endpoints]
    if nodes:
        lines.append("        nodes:")
        lines += [f"            - {_scalar(n)}" for n in nodes]
    lines += [
        f"        ca: {_b64(ca_crt)}",
        f"        crt: {_b64(client.crt)}",
        f"        key: {_b64(client.key)}",
    ]
    return "\n".join(lines) + "\n"


def _str_list(value: object, path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(path, "must be a list of strings")
    return list(value)


def _pem(ctx: dict, name: str, path: str) -> bytes:
    value = ctx.get(name)
    if value in (None, ""):
        return b""
    if not isinstance(value, str):
        raise ConfigError(f"{path}.{name}", "must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{path}.{name}", "is not valid base64") from None


def parse(text: str, context: str | None = None) -> TalosConfig:
    """Read a talosconfig and resolve `context` (default: the file's current context)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"talosconfig is not valid YAML: {exc.__class__.__name__}") from None
    if not isinstance(doc, dict):
        raise ConfigError("", "talosconfig must be a YAML mapping")
    contexts = doc.get("contexts")
    if not isinstance(contexts, dict) or not contexts:
        raise ConfigError("contexts", "at least one context is required")
    name = context or doc.get("context")
    if not name:
        raise ConfigError("context", "no context given and the file has no current context")
    if name not in contexts:
        raise ConfigError("context", f"context {name!r} not found (have: {', '.join(sorted(map(str, contexts)))})")
    ctx = contexts[name]
    path = f"contexts.{name}"
    if not isinstance(ctx, dict):
        raise ConfigError(path, "must be a mapping")
    endpoints = _str_list(ctx.get("endpoints"), f"{path}.endpoints")
    if ctx.get("target"):  # legacy single-endpoint key, folded in like talosctl does
        endpoints.append(str(ctx["target"]))
    return TalosConfig(
        context=str(name),
        endpoints=endpoints,
        nodes=_str_list(ctx.get("nodes"), f"{path}.nodes"),
        ca=_pem(ctx, "ca", path),
        crt=_pem(ctx, "crt", path),
        key=_pem(ctx, "key", path),
    )
