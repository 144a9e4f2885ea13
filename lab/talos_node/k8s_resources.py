"""Talos's `k8s` COSI resources of an emulated node, built from its machine config: the
StaticPods a control plane runs (kube-apiserver, kube-controller-manager, kube-scheduler) and
the KubeletSpec of every node, what talosctl upgrade-k8s's pre-flight reads.

As Talos v1.13.0 builds them (internal/app/machined/pkg/controllers/k8s/
control_plane_static_pod.go, kubelet_spec.go), cut down: a command of the binary and sorted
`--key=value` args, Talos's own defaults (a subset) merged with the config's extraArgs, the
additive keys (feature-gates, enable-admission-plugins, …) joined with commas, the rest
overwritten; a value may be a string or a list (one arg per item). A StaticPod's spec is the Pod
itself (StaticPodSpec.MarshalYAML); a KubeletSpec's is {image, args, expectedNodename, config}.

`talos.dev/config-version`: Talos writes the version of the component's config resource
(APIServerConfig, …), which starts at 1 and goes up whenever that rendered config changes. Here
a counter per node address and component does the same, from a digest of the config inputs of
that component; the lab's mirror Pods (lab/static_pods.py) carry the same number. Unlike
Talos's in-memory state it is not reset by a reboot (clients compare versions within a boot).
"""

from __future__ import annotations

import hashlib
import json
import threading

import yaml
from google.protobuf import struct_pb2

from lab.talos_node import protoenc

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

STATIC_POD = "StaticPods.kubernetes.talos.dev"
KUBELET_SPEC = "KubeletSpecs.kubernetes.talos.dev"
NAMESPACE = "k8s"
NAMESPACE_TEXT = "Kubernetes all node types resources."
CONFIG_VERSION = "talos.dev/config-version"
DEFAULT_VERSION = "v1.35.4"
STATIC_PODS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
KUBELET = "kubelet"
_IMAGE = {"kube-apiserver": ("cluster", "apiServer"), "kube-controller-manager": ("cluster", "controllerManager"),
          "kube-scheduler": ("cluster", "scheduler"), KUBELET: ("machine", "kubelet")}
# What each component's config resource is rendered from (ControlPlaneController, KubeletConfig).
_INPUTS = {
    "kube-apiserver": (_IMAGE["kube-apiserver"], ("cluster", "controlPlane", "endpoint"),
                       ("cluster", "network", "serviceSubnets")),
    "kube-controller-manager": (_IMAGE["kube-controller-manager"], ("cluster", "network", "podSubnets"),
                                ("cluster", "network", "serviceSubnets")),
    "kube-scheduler": (_IMAGE["kube-scheduler"],),
    KUBELET: (_IMAGE[KUBELET],),
}
_ADDITIVE = {
    "kube-apiserver": {"enable-admission-plugins", "feature-gates", "authorization-mode", "tls-cipher-suites"},
    "kube-controller-manager": {"service-cluster-ip-range", "controllers"},
    "kube-scheduler": set(),
    KUBELET: set(),
}


def _dig(doc: object, path: tuple[str, ...]) -> object:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def image(doc: dict, component: str) -> str:
    """The component's image in the config, Talos's default when it names none."""
    name = "ghcr.io/siderolabs/kubelet" if component == KUBELET else f"registry.k8s.io/{component}"
    return str(_dig(doc, (*_IMAGE[component], "image")) or f"{name}:{DEFAULT_VERSION}")


# --- config-version: a counter per node and component ---------------------------------------------

_lock = threading.Lock()
_versions: dict[tuple[str, str], tuple[str, int]] = {}  # (address, component) → (config digest, version)


def _digest(doc: dict, component: str) -> str:
    inputs = [_dig(doc, path) for path in _INPUTS[component]]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def config_version(address: str, doc: dict, component: str) -> int:
    """The version of the component's config on this node: 1 at first sight, +1 on each change."""
    digest = _digest(doc, component)
    with _lock:
        seen = _versions.get((address, component))
        if seen is None or seen[0] != digest:
            seen = (digest, 1 if seen is None else seen[1] + 1)
            _versions[(address, component)] = seen
        return seen[1]


# --- args -------------------------------------------------------------------------------------------


def _defaults(doc: dict, component: str) -> dict[str, list[str]]:
    endpoint = str(_dig(doc, ("cluster", "controlPlane", "endpoint")) or "")
    services = ",".join(_dig(doc, ("cluster", "network", "serviceSubnets")) or ["10.96.0.0/12"])
    pods = ",".join(_dig(doc, ("cluster", "network", "podSubnets")) or ["10.244.0.0/16"])
    return {
        "kube-apiserver": {"allow-privileged": ["true"], "anonymous-auth": ["false"], "api-audiences": [endpoint],
                           "bind-address": ["0.0.0.0"], "enable-admission-plugins": ["NodeRestriction"],
                           "etcd-servers": ["https://localhost:2379"], "profiling": ["false"], "secure-port": ["6443"],
                           "service-account-issuer": [endpoint], "service-cluster-ip-range": [services],
                           "tls-min-version": ["VersionTLS12"]},
        "kube-controller-manager": {"allocate-node-cidrs": ["true"], "bind-address": ["127.0.0.1"],
                                    "cluster-cidr": [pods], "controllers": ["*,tokencleaner"], "leader-elect": ["true"],
                                    "profiling": ["false"], "service-cluster-ip-range": [services],
                                    "tls-min-version": ["VersionTLS13"]},
        "kube-scheduler": {"bind-address": ["127.0.0.1"], "config": ["/system/config/kube-scheduler/scheduler-config.yaml"],
                           "leader-elect": ["true"], "profiling": ["false"], "tls-min-version": ["VersionTLS13"]},
        KUBELET: {"cert-dir": ["/var/lib/kubelet/pki"], "config": ["/etc/kubernetes/kubelet.yaml"],
                  "kubeconfig": ["/etc/kubernetes/kubeconfig-kubelet"]},
    }[component]


def args(doc: dict, component: str) -> list[str]:
    """`--key=value` args, sorted by key: Talos's defaults merged with the config's extraArgs."""
    merged = _defaults(doc, component)
    extra = _dig(doc, (*_IMAGE[component], "extraArgs"))
    for key, value in (extra.items() if isinstance(extra, dict) else ()):
        values = [str(v) for v in (value if isinstance(value, list) else [value]) if v is not None]
        if key in _ADDITIVE[component]:
            items = [i.strip() for v in merged.get(key, []) + values for i in v.split(",") if i.strip()]
            merged[key] = [",".join(dict.fromkeys(items))]
        else:
            merged[str(key)] = values
    return [f"--{k}={v}" for k in sorted(merged) for v in merged[k]]


# --- the resources ------------------------------------------------------------------------------------


def static_pod(doc: dict, component: str, *, address: str) -> dict:
    """The StaticPod's spec: the Pod Talos hands the kubelet."""
    command = [f"/usr/local/bin/{component}"]
    if component == "kube-controller-manager":
        command.append("--use-service-account-credentials")
    version = image(doc, component).rsplit(":", 1)[-1]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": component,
            "namespace": "kube-system",
            "annotations": {CONFIG_VERSION: str(config_version(address, doc, component))},
            "labels": {"tier": "control-plane", "k8s-app": component, "component": component,
                       "app.kubernetes.io/name": component, "app.kubernetes.io/version": version.removeprefix("v"),
                       "app.kubernetes.io/component": "control-plane", "app.kubernetes.io/managed-by": "Talos"},
        },
        "spec": {
            "priorityClassName": "system-cluster-critical",
            "hostNetwork": True,
            "containers": [{"name": component, "image": image(doc, component), "command": command + args(doc, component)}],
        },
    }


def kubelet_spec(doc: dict, *, hostname: str, address: str) -> dict:
    """The KubeletSpec's spec: hostname-override and node-ip are Talos's unless extraArgs set them."""
    own = [f"--{k}={v}" for k, v in (("hostname-override", hostname), ("node-ip", address))
           if k not in (_dig(doc, (*_IMAGE[KUBELET], "extraArgs")) or {})]
    return {"image": image(doc, KUBELET), "args": sorted(args(doc, KUBELET) + own, key=lambda a: a.split("=", 1)[0]),
            "expectedNodename": hostname,
            "config": {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"}}


DEFINITIONS = ((STATIC_POD, "StaticPod"), (KUBELET_SPEC, "KubeletSpec"))  # (type, display), namespace k8s
OWNERS = {STATIC_POD: "k8s.ControlPlaneStaticPodController", KUBELET_SPEC: "k8s.KubeletSpecController"}


def specs_of(config: bytes, address: str) -> dict[tuple[str, str], dict]:
    """specs() of an applied config (the raw bytes a node holds; empty in maintenance mode)."""
    if not config:
        return {}
    doc = next((d for d in yaml.load_all(config, Loader=_Loader)
                if isinstance(d, dict) and d.get("version") == "v1alpha1" and "kind" not in d), None)
    if doc is None:
        return {}
    machine = doc.get("machine") or {}
    hostname = str(_dig(machine, ("network", "hostname")) or "talos-" + address.replace(".", "-"))
    return specs(doc, address=address, hostname=hostname,
                 control_plane=machine.get("type") in ("controlplane", "init"))


def _struct(obj: dict) -> bytes:
    struct = struct_pb2.Struct()
    struct.update(obj)
    return struct.SerializeToString()


def static_pod_proto(pod: dict) -> bytes:
    """Talos's StaticPodSpec{google.protobuf.Struct pod = 1}, what its Go clients decode."""
    return protoenc.field(1, _struct(pod))


def kubelet_spec_proto(spec: dict) -> bytes:
    """KubeletSpecSpec{image = 1, repeated args = 2, expected_nodename = 4, Struct config = 5}."""
    return (protoenc.field(1, spec["image"]) + b"".join(protoenc.field(2, a) for a in spec["args"])
            + protoenc.field(4, spec["expectedNodename"]) + protoenc.field(5, _struct(spec["config"])))


def specs(doc: dict, *, address: str, hostname: str, control_plane: bool) -> dict[tuple[str, str], dict]:
    """(namespace, type) → {id: (spec, proto)}: StaticPods on a control plane, every node's KubeletSpec."""
    pods = {c: static_pod(doc, c, address=address) for c in STATIC_PODS} if control_plane else {}
    kubelet = kubelet_spec(doc, hostname=hostname, address=address)
    return {(NAMESPACE, STATIC_POD): {c: (pod, static_pod_proto(pod)) for c, pod in pods.items()},
            (NAMESPACE, KUBELET_SPEC): {KUBELET: (kubelet, kubelet_spec_proto(kubelet))}}
