"""Talos v1alpha1 machine configs for one pinned config contract.

We render what `talosctl gen config` emits for the pinned contract (so Talos's own validator
and operators' expectations both hold), plus Kontinuum's fixed choices: CNI none (Cilium comes
later), kube-proxy disabled, KubePrism on 7445. Stack-config patches are applied cluster →
pool → node. Same inputs give the same bytes, so a diff means a real change.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

import yaml

from kontinuum.errors import ConfigError, ConfigErrors
from kontinuum.talos import configpatch, goyaml
from kontinuum.talos.configpatch import Patch
from kontinuum.talos.secrets import SecretsBundle

TALOS_CONTRACT = "v1.13"  # single-document v1alpha1; 1.14 moves identity/k8s into other documents
TALOS_VERSION = "v1.13.0"
DEFAULT_INSTALLER_IMAGE = f"ghcr.io/siderolabs/installer:{TALOS_VERSION}"
KUBEPRISM_PORT = 7445
CONTROLPLANE = "controlplane"
WORKER = "worker"
CNI_NAMES = ("flannel", "custom", "none")
REDACTED = "******"  # what talosctl's RedactSecrets writes

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


# --- spec -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NetworkSpec:
    pod_subnets: tuple[str, ...] = ("10.244.0.0/16",)
    service_subnets: tuple[str, ...] = ("10.96.0.0/12",)
    dns_domain: str = "cluster.local"


@dataclass(frozen=True)
class PoolSpec:
    """A set of interchangeable machines; the control plane is the pool named `controlplane`."""

    name: str
    replicas: int
    install_disk: str = "/dev/sda"
    node_labels: Mapping[str, str] = field(default_factory=dict)
    patches: tuple[Patch, ...] = ()


@dataclass(frozen=True)
class NodeSpec:
    """Per-machine overrides; `name` only identifies the node in error paths."""

    name: str
    install_disk: str | None = None
    node_labels: Mapping[str, str] = field(default_factory=dict)
    patches: tuple[Patch, ...] = ()


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    endpoint: str
    kubernetes_version: str
    control_plane: PoolSpec = field(default_factory=lambda: PoolSpec(CONTROLPLANE, 1))
    workers: tuple[PoolSpec, ...] = ()
    network: NetworkSpec = field(default_factory=NetworkSpec)
    installer_image: str = DEFAULT_INSTALLER_IMAGE
    cert_sans: tuple[str, ...] = ()
    patches: tuple[Patch, ...] = ()

    @property
    def has_workers(self) -> bool:
        return any(p.replicas > 0 for p in self.workers)

    @property
    def endpoint_host(self) -> str:
        return urlsplit(self.endpoint).hostname or ""


# --- spec validation ------------------------------------------------------------------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_PART = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"^(?=.{{1,253}}$){_DNS_PART}(\.{_DNS_PART})*$")
_K8S_VERSION = re.compile(r"^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")


def _label_problem(key: Any, value: Any) -> str | None:
    if not isinstance(key, str) or not isinstance(value, str):
        return "label keys and values must be strings"
    prefix, _, name = key.rpartition("/")
    if prefix and not _DNS_NAME.match(prefix):
        return f"label key prefix {prefix!r} must be a DNS subdomain"
    if not _LABEL_NAME.match(name):
        return f"label key {key!r} is not a valid Kubernetes label name"
    if value and not _LABEL_NAME.match(value):
        return f"label value {value!r} is not a valid Kubernetes label value"
    return None


def _cidr(value: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    if not isinstance(value, str) or "/" not in value:
        return None
    try:
        return ipaddress.ip_network(value, strict=True)
    except ValueError:
        return None


def _endpoint_problem(endpoint: Any) -> str | None:
    want = f"must be https://host:port, got {endpoint!r}"
    if not isinstance(endpoint, str):
        return want
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return want
    if parts.scheme != "https" or not parts.hostname or port is None or not 0 < port < 65536:
        return want
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        return want
    return None


def _pool_problems(pool: Any, path: str, *, controlplane: bool) -> Iterable[ConfigError]:
    replicas = pool.replicas
    if controlplane:
        if isinstance(replicas, bool) or replicas not in (1, 3, 5):
            yield ConfigError(f"{path}.replicas", f"must be 1, 3 or 5, got {replicas!r}")
    elif isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        yield ConfigError(f"{path}.replicas", f"must be a whole number >= 0, got {replicas!r}")
    yield from _node_problems(pool.install_disk, pool.node_labels, pool.patches, path)


def _node_problems(install_disk: Any, labels: Any, patches: Any, path: str) -> Iterable[ConfigError]:
    if install_disk is not None and not (isinstance(install_disk, str) and re.match(r"^/dev/\S+$", install_disk)):
        yield ConfigError(f"{path}.installDisk", f"must be a device path like /dev/sda, got {install_disk!r}")
    if not isinstance(labels, Mapping):
        yield ConfigError(f"{path}.nodeLabels", "must be a mapping of label to value")
    else:
        for key, value in labels.items():
            problem = _label_problem(key, value)
            if problem:
                yield ConfigError(f"{path}.nodeLabels.{key}", problem)
    yield from _patch_problems(patches, f"{path}.patches")


def _patch_problems(patches: Any, path: str) -> Iterable[ConfigError]:
    if not isinstance(patches, (tuple, list)):
        yield ConfigError(path, "must be a list of patches")
        return
    for i, patch in enumerate(patches):
        try:
            configpatch.normalize(patch, f"{path}[{i}]")
        except ConfigError as exc:
            yield exc


def spec_problems(spec: ClusterSpec, prefix: str = "") -> list[ConfigError]:
    """Every problem in the spec, each with its stack-config path (prefixed, e.g. `zones[1].`)."""
    out: list[ConfigError] = []
    add = out.append

    if not isinstance(spec.name, str) or not _DNS_LABEL.match(spec.name):
        add(ConfigError("name", f"must be a DNS label (lowercase letters, digits, '-'), got {spec.name!r}"))
    problem = _endpoint_problem(spec.endpoint)
    if problem:
        add(ConfigError("endpoint", problem))
    if not isinstance(spec.kubernetes_version, str) or not _K8S_VERSION.match(spec.kubernetes_version):
        add(ConfigError("kubernetesVersion", f"must be a version like 1.34.1, got {spec.kubernetes_version!r}"))
    image = spec.installer_image
    if not isinstance(image, str) or not re.match(r"^[^\s:@]+(:[\w][\w.-]*)?(@sha256:[0-9a-f]{64})?$", image) or not (
        ":" in image.rsplit("/", 1)[-1] or "@" in image
    ):
        add(ConfigError("installerImage", f"must be an image reference with a tag or digest, got {image!r}"))

    nets: dict[str, list] = {}
    for key, values in (("podSubnets", spec.network.pod_subnets), ("serviceSubnets", spec.network.service_subnets)):
        if not values:
            add(ConfigError(f"network.{key}", "at least one CIDR is required"))
        nets[key] = []
        for i, value in enumerate(values or ()):
            net = _cidr(value)
            if net is None:
                add(ConfigError(f"network.{key}[{i}]", "not a CIDR"))
            else:
                nets[key].append((i, net))
    for i, pod in nets["podSubnets"]:
        for j, svc in nets["serviceSubnets"]:
            if pod.version == svc.version and pod.overlaps(svc):
                add(ConfigError(f"network.serviceSubnets[{j}]", f"overlaps network.podSubnets[{i}]"))
    if not isinstance(spec.network.dns_domain, str) or not _DNS_NAME.match(spec.network.dns_domain):
        add(ConfigError("network.dnsDomain", f"must be a DNS name, got {spec.network.dns_domain!r}"))

    for i, san in enumerate(spec.cert_sans):
        if not isinstance(san, str) or not (_is_ip(san) or _DNS_NAME.match(san.removeprefix("*."))):
            add(ConfigError(f"certSANs[{i}]", f"must be a DNS name or IP address, got {san!r}"))

    out.extend(_pool_problems(spec.control_plane, "controlPlane", controlplane=True))
    seen: set[str] = set()
    for i, pool in enumerate(spec.workers):
        path = f"workers[{i}]"
        if not isinstance(pool.name, str) or not _DNS_LABEL.match(pool.name) or pool.name == CONTROLPLANE:
            add(ConfigError(f"{path}.name", f"must be a DNS label other than {CONTROLPLANE!r}, got {pool.name!r}"))
        elif pool.name in seen:
            add(ConfigError(f"{path}.name", f"duplicate worker pool name {pool.name!r}"))
        seen.add(pool.name)
        out.extend(_pool_problems(pool, path, controlplane=False))
    out.extend(_patch_problems(spec.patches, "patches"))

    if prefix:
        out = [ConfigError(prefix + e.path, e.problem) for e in out]
    return out


def validate_spec(spec: ClusterSpec, prefix: str = "") -> None:
    problems = spec_problems(spec, prefix)
    if problems:
        raise ConfigErrors(problems)


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return False


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
        node_errors = list(_node_problems(node.install_disk, node.node_labels, node.patches, node_path))
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
    problems = _precheck_doc(doc)
    if problems:
        where = node_path or pool_path
        raise ConfigErrors([ConfigError(where, f"patched config is invalid: {p}") for p in problems])
    return doc


def render(
    spec: ClusterSpec, bundle: SecretsBundle, *, pool: str = CONTROLPLANE, node: NodeSpec | None = None
) -> bytes:
    """Machine config YAML for one machine of `pool` (`controlplane` or a worker pool name)."""
    return goyaml.dump(build(spec, bundle, pool=pool, node=node)).encode()


# --- redaction ------------------------------------------------------------------------------

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


# --- precheck -------------------------------------------------------------------------------


def _get(doc: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


# machinery's own (looser) notion of a DNS name for cluster.network.dnsDomain
_MACHINERY_DNS = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,62}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})*[._]?$")


def _precheck_doc(doc: dict, mode: str = "metal") -> list[str]:
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
    return _precheck_doc(v1[0])
