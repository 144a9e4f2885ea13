"""What the lab reads from an applied machine config (pure): the cluster's endpoint, CAs, keys
and subnets that its real control plane is built from, and each member's kubelet facts."""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import yaml

from kontinuum.talos.pki import CertKey
from lab.apiservers import ServingNames
from lab.controlplane import ClusterPKI
from lab.talos_node.node import EmulatedNode



def _b64(doc: dict, *path: str) -> bytes:
    value: object = doc
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if not value:
        raise ValueError(f"the machine config has no cluster.{'.'.join(path)}")
    return base64.b64decode(str(value))


@functools.lru_cache(maxsize=128)  # read on every reconcile tick; a config is replaced, never changed
def _v1alpha1(raw: bytes) -> dict:
    for doc in yaml.safe_load_all(raw):
        if isinstance(doc, dict) and doc.get("version") == "v1alpha1" and "kind" not in doc:
            return doc
    raise ValueError("the machine config has no v1alpha1 document")


def v1alpha1(raw: bytes) -> dict:
    """The v1alpha1 document of an applied config (cached: read on every tick; do not change it)."""
    return _v1alpha1(raw)


@dataclass(frozen=True)
class ClusterConfig:
    """A control plane's view of its cluster, from its applied machine config."""

    name: str
    endpoint: str
    pki: ClusterPKI
    pod_subnet: str
    service_subnet: str
    allow_scheduling_on_control_planes: bool
    kube_proxy: bool = False  # Talos's kube-proxy enabled (cluster.proxy.disabled false)
    cert_sans: tuple[str, ...] = ()  # cluster.apiServer.certSANs
    dns_domain: str = "cluster.local"  # cluster.network.dnsDomain

    @property
    def endpoint_host(self) -> str:
        return urlsplit(self.endpoint).hostname or ""

    @property
    def endpoint_port(self) -> int:
        return urlsplit(self.endpoint).port or 6443

    @property
    def serving_names(self) -> ServingNames:
        """What every apiserver certificate of the cluster names besides its own node."""
        return ServingNames(tuple(n for n in (self.endpoint_host, *self.cert_sans) if n), self.dns_domain)


def read_cluster_config(raw: bytes) -> ClusterConfig:
    """The CAs, keys and networks of a control plane's config (base64 PEM, Talos key labels)."""
    doc = _v1alpha1(raw)
    cluster = doc.get("cluster") or {}
    network = cluster.get("network") or {}
    pki_ = ClusterPKI(
        ca=CertKey(_b64(cluster, "ca", "crt"), _b64(cluster, "ca", "key")),
        aggregator_ca=CertKey(_b64(cluster, "aggregatorCA", "crt"), _b64(cluster, "aggregatorCA", "key")),
        etcd_ca=CertKey(_b64(cluster, "etcd", "ca", "crt"), _b64(cluster, "etcd", "ca", "key")),
        service_account_key=_b64(cluster, "serviceAccount", "key"),
        accepted_cas=b"".join(base64.b64decode(str(c["crt"])) for c in cluster.get("acceptedCAs") or []
                              if isinstance(c, dict) and c.get("crt")),
    )
    return ClusterConfig(
        name=str(cluster.get("clusterName") or "talos-default"),
        endpoint=str((cluster.get("controlPlane") or {}).get("endpoint") or ""),
        pki=pki_,
        pod_subnet=str((network.get("podSubnets") or ["10.244.0.0/16"])[0]),
        service_subnet=str((network.get("serviceSubnets") or ["10.96.0.0/12"])[0]),
        allow_scheduling_on_control_planes=bool(cluster.get("allowSchedulingOnControlPlanes")),
        kube_proxy=not bool((cluster.get("proxy") or {}).get("disabled")),
        cert_sans=tuple(str(s) for s in (cluster.get("apiServer") or {}).get("certSANs") or []),
        dns_domain=str(network.get("dnsDomain") or "cluster.local"),
    )


@dataclass(frozen=True)
class MemberInfo:
    """One emulated node as its kubelet would register it."""

    hostname: str
    address: str
    control_plane: bool
    node_labels: dict[str, str] = field(default_factory=dict)
    kubelet_version: str = "v1.35.4"
    talos_version: str = "v1.13.0"

    @classmethod
    def of(cls, node: EmulatedNode) -> "MemberInfo":
        assert node.config is not None
        doc = _v1alpha1(node.config.raw)
        machine = doc.get("machine") or {}
        image = str((machine.get("kubelet") or {}).get("image") or "")
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else "v1.35.4"
        labels = {str(k): str(v) for k, v in (machine.get("nodeLabels") or {}).items()}
        return cls(node.hostname, node.address, node.is_control_plane, labels, tag, node.talos_version)
