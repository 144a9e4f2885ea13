"""What an emulated node reads from, and checks in, an applied machine config.

The checks are our own, independent of kontinuum.talos.machineconfig on purpose: the emulator
stands in for Talos, so it must not share the generator's assumptions. They cover what
Talos's validator rejects most often (in "metal" mode), with Talos's wording where we know it;
Talos's real validator runs against our configs in the Go conformance tests.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

import yaml

from kontinuum.talos import pki
from kontinuum.talos.pki import CertKey

MACHINE_TYPES = {"init", "controlplane", "worker"}
_V1ALPHA1_KEYS = {"version", "debug", "persist", "machine", "cluster"}


class InvalidConfig(Exception):
    """The config would not pass Talos's validator; the message is what the node reports."""


@dataclass(frozen=True)
class AppliedConfig:
    raw: bytes
    machine_type: str
    os_ca: CertKey  # key is empty on workers
    trusted_cas: bytes  # machine.ca plus machine.acceptedCAs: the client CAs apid accepts
    cert_sans: tuple[str, ...]
    hostname: str | None
    cluster_key: str
    cluster_name: str
    endpoint: str
    k8s_ca: CertKey | None  # with key on control planes
    k8s_trusted: bytes = b""  # cluster.ca plus cluster.acceptedCAs: the chain the apiserver runs on

    @property
    def is_control_plane(self) -> bool:
        return self.machine_type in ("controlplane", "init")


def cluster_key_of(cluster_id: str | None, os_ca_crt: bytes) -> str:
    """How the emulator tells clusters apart: the config's cluster.id, or, for configs without
    one, a hash of the OS CA (nodes of one cluster always share it)."""
    return cluster_id or "os-ca-sha256:" + hashlib.sha256(os_ca_crt).hexdigest()[:16]


def _multierror(errors: list[str]) -> str:
    """The shape of Talos's validation errors (hashicorp/go-multierror)."""
    noun = "error" if len(errors) == 1 else "errors"
    return f"{len(errors)} {noun} occurred:\n" + "".join(f"\t* {e}\n" for e in errors) + "\n"


def _get(doc: object, *path: str) -> object:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def _pem(value: object, where: str, errors: list[str]) -> bytes:
    if value in (None, ""):
        return b""
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        errors.append(f"{where}: invalid base64")
        return b""


@functools.lru_cache(maxsize=128)
def v1alpha1_document(data: bytes) -> dict:
    """The v1alpha1 document of an applied (so already valid) config. Parsed once per config (the
    lab's passes read it every tick, and YAML parsing was a sixth of an HA lab's CPU): the dict is
    shared, so read it and never change it."""
    return _v1alpha1(data)


def _v1alpha1(data: bytes) -> dict:
    try:
        docs = [d for d in yaml.safe_load_all(data) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise InvalidConfig(f"failed to decode the config: invalid YAML{where}") from None
    found = [d for d in docs if isinstance(d, dict) and "version" in d and "kind" not in d]
    for doc in found:
        if doc["version"] != "v1alpha1":
            raise InvalidConfig(f'unknown config version "{doc["version"]}"')
    if not found:
        raise InvalidConfig(
            "the applied machine configuration doesn't contain v1alpha1 config, "
            "did you mean to patch the machine config instead?"
        )
    if len(found) > 1:
        raise InvalidConfig("duplicate v1alpha1 document")
    unknown = sorted(set(found[0]) - _V1ALPHA1_KEYS)
    if unknown:
        raise InvalidConfig("unknown keys found during decoding:\n" + "".join(f"{k}: ...\n" for k in unknown))
    return found[0]


def parse(data: bytes) -> AppliedConfig:
    """Validate `data` as a node in metal mode would and return what the emulator needs."""
    doc = _v1alpha1(data)
    errors: list[str] = []
    machine, cluster = doc.get("machine"), doc.get("cluster")
    if not isinstance(machine, dict):
        raise InvalidConfig(_multierror(["machine instructions are required"]))
    if not isinstance(cluster, dict):
        errors.append("cluster instructions are required")
        cluster = {}

    machine_type = machine.get("type") or "worker"
    if machine_type == "join":
        machine_type = "worker"
    if machine_type not in MACHINE_TYPES:
        errors.append(f'unknown machine type: "{machine_type}"')
    control_plane = machine_type in ("controlplane", "init")
    if doc.get("persist") is False:
        errors.append(".persist should be enabled")

    ca_crt = _pem(_get(machine, "ca", "crt"), ".machine.ca.crt", errors)
    ca_key = _pem(_get(machine, "ca", "key"), ".machine.ca.key", errors)
    accepted = b"".join(_pem(c.get("crt"), ".machine.acceptedCAs", errors) for c in machine.get("acceptedCAs") or [] if isinstance(c, dict))
    if not ca_crt and not accepted:
        errors.append("at least one of .machine.ca or .machine.acceptedCAs is required")
    if ca_crt:
        try:
            pki.load_certificate(ca_crt)
        except ValueError:
            errors.append(".machine.ca.crt: failed to parse PEM certificate")
    if control_plane and not ca_key:
        errors.append("issuing CA key is required for controlplane nodes (.machine.ca.key)")
    if not control_plane and ca_key:
        errors.append("issuing CA key is not allowed on non-controlplane nodes (.machine.ca)")

    install = machine.get("install")
    if not isinstance(install, dict):
        errors.append('install instructions are required in "metal" mode')
    elif not install.get("disk") and not install.get("diskSelector"):
        errors.append("either install disk or diskSelector should be defined")

    endpoint = str(_get(cluster, "controlPlane", "endpoint") or "")
    if not endpoint:
        errors.append("cluster controlplane endpoint is required")
    else:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            errors.append(f'cluster controlplane endpoint is not a valid URL: "{endpoint}"')

    k8s_crt = _pem(_get(cluster, "ca", "crt"), ".cluster.ca.crt", errors)
    k8s_key = _pem(_get(cluster, "ca", "key"), ".cluster.ca.key", errors)
    k8s_accepted = b"".join(_pem(c.get("crt"), ".cluster.acceptedCAs", errors)
                            for c in cluster.get("acceptedCAs") or [] if isinstance(c, dict))
    if control_plane and not (k8s_crt and k8s_key):
        errors.append("cluster CA certificate and key are required on controlplane nodes (.cluster.ca)")
    if not control_plane and k8s_key:
        errors.append("cluster CA key is not allowed on non-controlplane nodes (.cluster.ca.key)")
    if not control_plane and _get(cluster, "etcd") is not None:
        errors.append("etcd config is only allowed on control plane machines")

    cert_sans = machine.get("certSANs") or []
    if not isinstance(cert_sans, list) or not all(isinstance(s, str) for s in cert_sans):
        errors.append(".machine.certSANs must be a list of strings")
        cert_sans = []
    if errors:
        raise InvalidConfig(_multierror(errors))

    hostname = _get(machine, "network", "hostname")
    return AppliedConfig(
        raw=data,
        machine_type=machine_type,
        os_ca=CertKey(ca_crt, ca_key),
        trusted_cas=ca_crt + accepted,
        cert_sans=tuple(cert_sans),
        hostname=str(hostname) if hostname else None,
        cluster_key=cluster_key_of(str(cluster.get("id") or "") or None, ca_crt or accepted),
        cluster_name=str(cluster.get("clusterName") or "talos-default"),
        endpoint=endpoint,
        k8s_ca=CertKey(k8s_crt, k8s_key) if k8s_crt else None,
        k8s_trusted=k8s_crt + k8s_accepted,
    )


def split_sans(sans: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """certSANs hold both IPs and DNS names; certificates keep them apart."""
    ips, names = [], []
    for san in sans:
        try:
            ips.append(str(ipaddress.ip_address(san)))
        except ValueError:
            names.append(san)
    return ips, names
