"""The checks Talos's own validator makes of a rendered machine config, worded as it words them.

Rendering runs them on every patched config, so a patch that would break a machine fails at
preview with the field path, instead of on the machine at apply time.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import yaml

from kontinuum.talos.clusterspec import CONTROLPLANE, WORKER

CNI_NAMES = ("flannel", "custom", "none")


def _get(doc: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


# machinery's own (looser) notion of a DNS name for cluster.network.dnsDomain
_MACHINERY_DNS = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,62}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})*[._]?$")


def precheck_doc(doc: dict, mode: str = "metal") -> list[str]:
    """Machinery's v1alpha1 Validate cases we rely on, worded as machinery words them and
    prefixed with the field path, so a failure reads the same from us and from Talos."""
    problems: list[str] = []
    add = lambda path, msg: problems.append(f"{path}: {msg}")  # noqa: E731

    if doc.get("version") != "v1alpha1":
        add("version", f"invalid config version {doc.get('version')!r}: only v1alpha1 is supported")
    machine = doc.get("machine")
    if not isinstance(machine, dict):
        add("machine", "machine instructions are required")
        return problems
    mtype = machine.get("type")
    is_cp = mtype in ("init", CONTROLPLANE)
    is_worker = mtype in (WORKER, "join", "")

    cluster = doc.get("cluster")
    if not isinstance(cluster, dict):
        add("cluster", "cluster instructions are required")
    elif not _get(cluster, "controlPlane", "endpoint"):
        add("cluster.controlPlane.endpoint", "cluster controlplane endpoint is required")
    else:
        try:
            endpoint = urlsplit(str(_get(cluster, "controlPlane", "endpoint")))
            endpoint.port  # noqa: B018 - raises on a bad port, as machinery rejects it
            if not endpoint.hostname:
                add("cluster.controlPlane.endpoint", "invalid controlplane endpoint: hostname must not be blank")
        except ValueError:
            add("cluster.controlPlane.endpoint", "invalid controlplane endpoint: bad port")
        dns = _get(cluster, "network", "dnsDomain")
        if dns and not _MACHINERY_DNS.match(str(dns)):
            add("cluster.network.dnsDomain", f'"{dns}" is not a valid DNS name')
        if _get(cluster, "etcd") is not None and not is_cp:
            add("cluster.etcd", "etcd config is only allowed on control plane machines")
        if _get(cluster, "ca", "key") and not is_cp:
            add("cluster.ca.key", "cluster CA key is not allowed on non-controlplane nodes (.cluster.ca)")
        names = [m.get("name") if isinstance(m, dict) else None for m in _get(cluster, "inlineManifests") or []]
        for i, name in enumerate(names):
            if not str(name or "").strip():
                add(f"cluster.inlineManifests[{i}].name", "inline manifest name can't be empty")
            elif name in names[:i]:
                add(f"cluster.inlineManifests[{i}].name", f'inline manifest name "{name}" is duplicate')
        service_registry = not _get(cluster, "discovery", "registries", "service", "disabled")
        if _get(cluster, "discovery", "enabled") and service_registry:
            if not cluster.get("id"):
                add("cluster.id", "cluster discovery service requires .cluster.id")
            if not cluster.get("secret"):
                add("cluster.secret", "cluster discovery service requires .cluster.secret")

    if mode == "metal":
        install = machine.get("install")
        if not isinstance(install, dict):
            add("machine.install", f'install instructions are required in "{mode}" mode')
        else:
            if not install.get("disk") and not install.get("diskSelector"):
                add("machine.install.disk", "either install disk or diskSelector should be defined")
            if install.get("extraKernelArgs") and install.get("grubUseUKICmdline"):
                add("machine.install.extraKernelArgs", "install.extraKernelArgs and install.grubUseUKICmdline can't be used together")

    host_dns = _get(machine, "features", "hostDNS") or {}
    if isinstance(host_dns, dict) and host_dns.get("forwardKubeDNSToHost") and not host_dns.get("enabled"):
        add("machine.features.hostDNS", "feature hostDNS.forwardKubeDNSToHost requires hostDNS.enabled to be true (.machine.features.hostDNS)")

    if mtype in ("join", ""):
        add("machine.type", f'use "worker" instead of "{mtype}" for machine type')

    ca = machine.get("ca") if isinstance(machine.get("ca"), dict) else None
    if ca is None and not machine.get("acceptedCAs"):
        add("machine.ca", "issuing CA or some accepted CAs are required (.machine.ca, machine.acceptedCAs)")
    if is_cp:
        cni = _get(cluster, "network", "cni")
        # Like machinery: no cni section means flannel; a section without a name is invalid.
        cni_name = cni.get("name") if isinstance(cni, dict) else "flannel"
        if cni_name not in CNI_NAMES:
            add("cluster.network.cni.name", 'cni name should be one of ["flannel", "custom", "none"]')
        elif cni_name in ("flannel", "none") and isinstance(cni, dict) and cni.get("urls"):
            add("cluster.network.cni.urls", f'"urls" field should be empty for "{cni_name}" CNI')
        if ca is None:
            add("machine.ca", "issuing CA is required (.machine.ca)")
        elif not ca.get("key"):
            add("machine.ca.key", "issuing CA key is required for controlplane nodes (.machine.ca.key)")
    elif is_worker:
        if ca is not None and ca.get("key"):
            add("machine.ca.key", "issuing Talos API CA key is not allowed on non-controlplane nodes (.machine.ca)")
        if ca is not None and not ca.get("crt") and not machine.get("acceptedCAs"):
            add("machine.ca.crt", "trusted CA certificates are required on non-controlplane nodes (.machine.ca.crt, .machine.acceptedCAs)")
        if _get(cluster, "ca", "key"):
            add("cluster.ca.key", "issuing Kubernetes API CA key is not allowed on non-controlplane nodes (.cluster.ca)")
    else:
        add("machine.type", f'unknown machine type "{mtype}"')

    if doc.get("persist") is False:
        add("persist", ".persist should be enabled")
    return problems


def precheck(config: bytes | str) -> list[str]:
    """Problems Talos's metal-mode validator would report, as `<field path>: <machinery text>`."""
    text = config.decode() if isinstance(config, bytes) else config
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        return [f"(document): not valid YAML ({exc.__class__.__name__})"]
    v1 = [d for d in docs if isinstance(d, dict) and ("machine" in d or d.get("version") == "v1alpha1")]
    if not v1:
        return ["(document): no v1alpha1 config document"]
    return precheck_doc(v1[0])
