"""What one Talos cluster is made of (pools, nodes, network), and every problem with it.

The spec is the input of rendering (kontinuum.talos.machineconfig); it lives apart so stack-config
validation can report every problem, each with its stack-config path, without rendering anything.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

from kontinuum.errors import ConfigError, ConfigErrors
from kontinuum.talos import configpatch
from kontinuum.talos.configpatch import Patch

TALOS_CONTRACT = "v1.13"  # single-document v1alpha1; 1.14 moves identity/k8s into other documents
TALOS_VERSION = "v1.13.0"
DEFAULT_INSTALLER_IMAGE = f"ghcr.io/siderolabs/installer:{TALOS_VERSION}"
CONTROLPLANE = "controlplane"
WORKER = "worker"


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


# --- validation ---------------------------------------------------------------------------

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
    yield from node_problems(pool.install_disk, pool.node_labels, pool.patches, path)


def node_problems(install_disk: Any, labels: Any, patches: Any, path: str) -> Iterable[ConfigError]:
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
        if not isinstance(san, str) or not (is_ip(san) or _DNS_NAME.match(san.removeprefix("*."))):
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


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return False
