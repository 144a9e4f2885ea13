"""The Talos cluster secrets bundle, generated and stored exactly as `talosctl gen secrets` does.

Keeping talosctl's file format (lowercase keys, base64 of the PEM text, 4-space indentation,
fixed key order) lets an operator import an existing cluster's secrets.yaml and take ours to
talosctl; a load followed by a dump reproduces the file byte-for-byte.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import os
import re
import secrets as _random
from dataclasses import dataclass, fields
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization

from kontinuum.errors import ConfigError
from kontinuum.talos import goyaml, pki
from kontinuum.talos.pki import CertKey

__all__ = ["CertKey", "SecretsBundle", "generate", "load", "dump", "secret_values", "CA_VALIDITY_DAYS", "TOKEN_RE"]

CA_VALIDITY_DAYS = 3650  # talosctl: CAValidityTime = 87600h
TOKEN_RE = re.compile(r"^[a-z0-9]{6}\.[a-z0-9]{16}$")
_TOKEN_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class SecretsBundle:
    """Everything a Talos cluster's identity is made of; never log an instance.

    `aescbc_secret` only exists for bundles imported from Talos <= 1.2, which used AES-CBC
    instead of secretbox; exactly one of the two is set.
    """

    cluster_id: str
    cluster_secret: str
    bootstrap_token: str
    secretbox_secret: str
    trustd_token: str
    os: CertKey
    k8s: CertKey
    k8s_aggregator: CertKey
    k8s_serviceaccount_key: bytes
    etcd: CertKey
    aescbc_secret: str = ""

    def __repr__(self) -> str:
        return "SecretsBundle(<redacted>)"


def _token() -> str:
    pick = lambda n: "".join(_random.choice(_TOKEN_ALPHABET) for _ in range(n))  # noqa: E731
    return f"{pick(6)}.{pick(16)}"


def _b64_32() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def generate(now: dt.datetime | None = None) -> SecretsBundle:
    """A fresh bundle for the current Talos contract (secretbox, RSA service-account key)."""
    return SecretsBundle(
        cluster_id=_b64_32(),
        cluster_secret=_b64_32(),
        bootstrap_token=_token(),
        secretbox_secret=_b64_32(),
        trustd_token=_token(),
        os=pki.new_ca(organizations=["talos"], key_type="ed25519", days=CA_VALIDITY_DAYS, now=now),
        k8s=pki.new_ca(organizations=["kubernetes"], key_type="ecdsa", days=CA_VALIDITY_DAYS, now=now),
        k8s_aggregator=pki.new_ca(common_name="front-proxy", key_type="ecdsa", days=CA_VALIDITY_DAYS, now=now),
        k8s_serviceaccount_key=pki.talos_key_pem(pki.new_key("rsa")),
        etcd=pki.new_ca(organizations=["etcd"], key_type="ecdsa", days=CA_VALIDITY_DAYS, now=now),
    )


# --- load -----------------------------------------------------------------------------------


def _section(doc: dict, name: str) -> dict:
    value = doc.get(name)
    if value is None:
        raise ConfigError(name, f"{name} is required")
    if not isinstance(value, dict):
        raise ConfigError(name, f"{name} must be a mapping")
    return value


def _string(section: dict, sec: str, name: str, *, required: bool = True) -> str:
    path = f"{sec}.{name}"
    value = section.get(name)
    if value is None or value == "":
        if required:
            raise ConfigError(path, f"{path} is required")
        return ""
    if not isinstance(value, str):
        raise ConfigError(path, f"{path} must be a string")
    return value


def _pem(value: Any, path: str) -> bytes:
    if not isinstance(value, str) or not value:
        raise ConfigError(path, f"{path} is required")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(path, f"{path} is not valid base64") from None


def _cert_key(certs: dict, name: str, check_rsa: bool = True) -> CertKey:
    path = f"certs.{name}"
    entry = certs.get(name)
    if not isinstance(entry, dict):
        raise ConfigError(path, f"{path} is required")
    crt = _pem(entry.get("crt"), f"{path}.crt")
    key = _pem(entry.get("key"), f"{path}.key")
    try:
        cert = pki.load_certificate(crt)
    except ValueError:
        raise ConfigError(f"{path}.crt", f"{path}.crt is not a PEM certificate") from None
    try:
        private = pki.load_private_key(key, check_rsa=check_rsa)
    except (ValueError, TypeError):
        raise ConfigError(f"{path}.key", f"{path}.key is not a PEM private key") from None
    if _public_der(private.public_key()) != _public_der(cert.public_key()):
        raise ConfigError(path, f"{path} key does not match its certificate")
    return CertKey(crt, key)


def _public_der(public: Any) -> bytes:
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def load(text: str, *, check_rsa: bool = True) -> SecretsBundle:
    """Parse a talosctl secrets.yaml; errors name the field like machinery's Validate does."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"secrets bundle is not valid YAML: {exc.__class__.__name__}") from None
    if not isinstance(doc, dict):
        raise ConfigError("", "secrets bundle must be a YAML mapping")

    cluster = _section(doc, "cluster")
    secrets = _section(doc, "secrets")
    trustd = _section(doc, "trustdinfo")
    certs = _section(doc, "certs")

    secretbox = _string(secrets, "secrets", "secretboxencryptionsecret", required=False)
    aescbc = _string(secrets, "secrets", "aescbcencryptionsecret", required=False)
    if bool(secretbox) == bool(aescbc):
        which = "only one of" if secretbox else "one of"
        raise ConfigError(
            "secrets.secretboxencryptionsecret",
            f"{which} [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret] is "
            + ("allowed" if secretbox else "required"),
        )

    sa = certs.get("k8sserviceaccount")
    if not isinstance(sa, dict):
        raise ConfigError("certs.k8sserviceaccount", "certs.k8sserviceaccount is required")
    sa_key = _pem(sa.get("key"), "certs.k8sserviceaccount.key")
    try:
        pki.load_private_key(sa_key, check_rsa=check_rsa)
    except (ValueError, TypeError):
        raise ConfigError("certs.k8sserviceaccount.key", "certs.k8sserviceaccount.key is not a PEM private key") from None

    return SecretsBundle(
        cluster_id=_string(cluster, "cluster", "id"),
        cluster_secret=_string(cluster, "cluster", "secret"),
        bootstrap_token=_string(secrets, "secrets", "bootstraptoken"),
        secretbox_secret=secretbox,
        trustd_token=_string(trustd, "trustdinfo", "token"),
        os=_cert_key(certs, "os", check_rsa),
        k8s=_cert_key(certs, "k8s", check_rsa),
        k8s_aggregator=_cert_key(certs, "k8saggregator", check_rsa),
        k8s_serviceaccount_key=sa_key,
        etcd=_cert_key(certs, "etcd", check_rsa),
        aescbc_secret=aescbc,
    )


# --- dump -----------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def dump(bundle: SecretsBundle) -> str:
    """Render secrets.yaml in talosctl's exact layout."""
    if not isinstance(bundle, SecretsBundle):
        raise TypeError("dump expects a SecretsBundle")
    lines = [
        "cluster:",
        f"    id: {goyaml.scalar(bundle.cluster_id)}",
        f"    secret: {goyaml.scalar(bundle.cluster_secret)}",
        "secrets:",
        f"    bootstraptoken: {goyaml.scalar(bundle.bootstrap_token)}",
    ]
    if bundle.aescbc_secret:
        lines.append(f"    aescbcencryptionsecret: {goyaml.scalar(bundle.aescbc_secret)}")
    if bundle.secretbox_secret:
        lines.append(f"    secretboxencryptionsecret: {goyaml.scalar(bundle.secretbox_secret)}")
    lines += ["trustdinfo:", f"    token: {goyaml.scalar(bundle.trustd_token)}", "certs:"]
    for name, ck in (("etcd", bundle.etcd), ("k8s", bundle.k8s), ("k8saggregator", bundle.k8s_aggregator)):
        lines += [f"    {name}:", f"        crt: {_b64(ck.crt)}", f"        key: {_b64(ck.key)}"]
    lines += ["    k8sserviceaccount:", f"        key: {_b64(bundle.k8s_serviceaccount_key)}"]
    lines += ["    os:", f"        crt: {_b64(bundle.os.crt)}", f"        key: {_b64(bundle.os.key)}"]
    return "\n".join(lines) + "\n"


def secret_values(bundle: SecretsBundle) -> list[str]:
    """Every secret string a rendered config may contain, for redaction checks and log scrubbing."""
    out = [
        bundle.cluster_secret,
        bundle.bootstrap_token,
        bundle.secretbox_secret,
        bundle.aescbc_secret,
        bundle.trustd_token,
        _b64(bundle.k8s_serviceaccount_key),
    ]
    for f in fields(bundle):
        value = getattr(bundle, f.name)
        if isinstance(value, CertKey):
            out.append(_b64(value.key))
    return [v for v in out if v]
