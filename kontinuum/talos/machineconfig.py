"""Talos v1alpha1 machine configs for one pinned config contract.

We render what `talosctl gen config` emits for the pinned contract (so Talos's own validator
and operators' expectations both hold), plus Kontinuum's fixed choices: CNI none (Cilium comes
later), kube-proxy disabled, KubePrism on 7445. Stack-config patches are applied cluster →
pool → node. Same inputs give the same bytes, so a diff means a real change. The spec and its
validation live in kontinuum.talos.clusterspec, Talos's validator checks in kontinuum.talos.precheck,
secret masking in kontinuum.talos.redaction.
"""

from __future__ import annotations

import base64
import copy
from typing import Any, Iterable

from kontinuum.errors import ConfigError, ConfigErrors
from kontinuum.talos import configpatch, goyaml
from kontinuum.talos.clusterspec import (
    CONTROLPLANE, WORKER, ClusterSpec, NodeSpec, PoolSpec, node_problems, validate_spec,
)
from kontinuum.talos.precheck import precheck_doc
from kontinuum.talos.secrets import SecretsBundle

KUBEPRISM_PORT = 7445

_EXCLUDE_LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
_POD_SECURITY = {
    "name": "PodSecurity",
    "configuration": {
        "apiVersion": "pod-security.admission.config.k8s.io/v1alpha1",
        "kind": "PodSecurityConfiguration",
        "defaults": {
            "enforce": "baseline",
            "enforce-version": "latest",
            "audit": "restricted",
            "audit-version": "latest",
            "warn": "restricted",
            "warn-version": "latest",
        },
        "exemptions": {"usernames": [], "runtimeClasses": [], "namespaces": ["kube-system"]},
    },
}
_AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}


# --- rendering ------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def _pool(spec: ClusterSpec, name: str) -> tuple[PoolSpec, str]:
    if name == CONTROLPLANE:
        return spec.control_plane, "controlPlane"
    for i, pool in enumerate(spec.workers):
        if pool.name == name:
            return pool, f"workers[{i}]"
    known = ", ".join([CONTROLPLANE] + [p.name for p in spec.workers])
    raise ConfigError("pool", f"unknown pool {name!r} (known: {known})")


def _version(spec: ClusterSpec) -> str:
    return spec.kubernetes_version.removeprefix("v")


def _machine(spec: ClusterSpec, bundle: SecretsBundle, pool: PoolSpec, node: NodeSpec | None, cp: bool) -> dict:
    labels: dict[str, str] = {}
    # talosctl adds this label on control planes; without workers the control planes must
    # take load-balancer traffic, so we leave it off then.
    if cp and spec.has_workers:
        labels[_EXCLUDE_LB_LABEL] = ""
    labels.update(pool.node_labels)
    if node:
        labels.update(node.node_labels)
    machine: dict[str, Any] = {
        "type": CONTROLPLANE if cp else WORKER,
        "token": bundle.trustd_token,
        "ca": {"crt": _b64(bundle.os.crt), "key": _b64(bundle.os.key)} if cp else {"crt": _b64(bundle.os.crt)},
        "certSANs": _dedupe(spec.cert_sans),
        "kubelet": {
            "image": f"ghcr.io/siderolabs/kubelet:v{_version(spec)}",
            "defaultRuntimeSeccompProfileEnabled": True,
            "disableManifestsDirectory": True,
        },
        "install": {
            "disk": (node.install_disk if node and node.install_disk else pool.install_disk),
            "image": spec.installer_image,
            "wipe": False,
            "grubUseUKICmdline": True,
        },
        "features": {
            # Single-document stand-in for the HostnameConfig{auto: stable} document that
            # talosctl emits for this contract.
            "stableHostname": True,
            "diskQuotaSupport": True,
            "kubePrism": {"enabled": True, "port": KUBEPRISM_PORT},
            "hostDNS": {"enabled": True, "forwardKubeDNSToHost": True},
        },
    }
    if labels:
        machine["nodeLabels"] = {k: labels[k] for k in sorted(labels)}
    return machine


def _cluster(spec: ClusterSpec, bundle: SecretsBundle, cp: bool) -> dict:
    v = _version(spec)
    cluster: dict[str, Any] = {
        "id": bundle.cluster_id,
        "secret": bundle.cluster_secret,
        "controlPlane": {"endpoint": spec.endpoint},
        "clusterName": spec.name,
        "network": {
            "cni": {"name": "none"},
            "dnsDomain": spec.network.dns_domain,
            "podSubnets": list(spec.network.pod_subnets),
            "serviceSubnets": list(spec.network.service_subnets),
        },
        "token": bundle.bootstrap_token,
    }
    discovery = {"enabled": True, "registries": {"kubernetes": {"disabled": True}, "service": {}}}
    if not cp:
        cluster["ca"] = {"crt": _b64(bundle.k8s.crt)}
        cluster["discovery"] = discovery
        return cluster
    if bundle.secretbox_secret:
        cluster["secretboxEncryptionSecret"] = bundle.secretbox_secret
    else:
        cluster["aescbcEncryptionSecret"] = bundle.aescbc_secret
    cluster.update(
        {
            "ca": {"crt": _b64(bundle.k8s.crt), "key": _b64(bundle.k8s.key)},
            "aggregatorCA": {"crt": _b64(bundle.k8s_aggregator.crt), "key": _b64(bundle.k8s_aggregator.key)},
            "serviceAccount": {"key": _b64(bundle.k8s_serviceaccount_key)},
            "apiServer": {
                "image": f"registry.k8s.io/kube-apiserver:v{v}",
                "certSANs": _dedupe([spec.endpoint_host, *spec.cert_sans]),
                "admissionControl": [_POD_SECURITY],
                "auditPolicy": _AUDIT_POLICY,
            },
            "controllerManager": {"image": f"registry.k8s.io/kube-controller-manager:v{v}"},
            # Cilium replaces kube-proxy (kubeProxyReplacement through KubePrism).
            "proxy": {"disabled": True, "image": f"registry.k8s.io/kube-proxy:v{v}"},
            "scheduler": {"image": f"registry.k8s.io/kube-scheduler:v{v}"},
            "discovery": discovery,
            "etcd": {"ca": {"crt": _b64(bundle.etcd.crt), "key": _b64(bundle.etcd.key)}},
            "extraManifests": [],
            "inlineManifests": [],
        }
    )
    if not spec.has_workers:
        cluster["allowSchedulingOnControlPlanes"] = True
    return cluster


def build(spec: ClusterSpec, bundle: SecretsBundle, *, pool: str = CONTROLPLANE, node: NodeSpec | None = None) -> dict:
    """The config as plain data after all patches; `render` is this plus serialisation."""
    validate_spec(spec)
    pool_spec, pool_path = _pool(spec, pool)
    node_path = f"nodes.{node.name}" if node else ""
    if node:
        node_errors = list(node_problems(node.install_disk, node.node_labels, node.patches, node_path))
        if node_errors:
            raise ConfigErrors(node_errors)
    cp = pool == CONTROLPLANE
    doc: dict[str, Any] = copy.deepcopy(
        {
            "version": "v1alpha1",
            "debug": False,
            "persist": True,
            "machine": _machine(spec, bundle, pool_spec, node, cp),
            "cluster": _cluster(spec, bundle, cp),
        }
    )  # callers may edit the result; module-level defaults must stay untouched
    layers = [("patches", spec.patches), (f"{pool_path}.patches", pool_spec.patches)]
    if node:
        layers.append((f"{node_path}.patches", node.patches))
    for where, patches in layers:
        for i, patch in enumerate(patches):
            doc = configpatch.apply(doc, patch, f"{where}[{i}]")
            if not isinstance(doc, dict):
                raise ConfigError(f"{where}[{i}]", "patch must leave a mapping at the document root")
    problems = precheck_doc(doc)
    if problems:
        where = node_path or pool_path
        raise ConfigErrors([ConfigError(where, f"patched config is invalid: {p}") for p in problems])
    return doc


def render(
    spec: ClusterSpec, bundle: SecretsBundle, *, pool: str = CONTROLPLANE, node: NodeSpec | None = None
) -> bytes:
    """Machine config YAML for one machine of `pool` (`controlplane` or a worker pool name)."""
    return goyaml.dump(build(spec, bundle, pool=pool, node=node)).encode()
