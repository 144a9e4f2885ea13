"""Typed stack config (`kontinuum:` namespace) with path-precise validation.

Everything is checked before a single resource is registered, and every problem is reported
at once with its path (`zones[1].controlPlane.replicas: must be 1, 3 or 5, got 2`), so an
operator fixes the file in one round. This module reads plain data; __main__ feeds it from
pulumi.Config, the tests feed it dicts.
"""

from __future__ import annotations

import copy
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from kontinuum.errors import ConfigError, ConfigErrors
from kontinuum.talos.machineconfig import TALOS_VERSION
from kontinuum.talos.waits import WAIT_DEFAULTS

DEFAULT_KUBERNETES_VERSION = "v1.35.4"
DEFAULT_SERVER_IMAGE = "ghcr.io/kontinuum-sh/kontinuum-server:latest"
LETSENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"
CONTROL_PLANE_POOL = "controlplane"

# Upstream charts by default; the lab stack points these at lab/charts.
DEFAULT_CHARTS = {
    "cilium": {"repo": "https://helm.cilium.io/", "chart": "cilium", "version": "1.18.4", "namespace": "kube-system"},
    "certManager": {"repo": "https://charts.jetstack.io", "chart": "cert-manager", "version": "v1.19.1",
                    "namespace": "cert-manager"},
}
DEFAULT_GATEWAY_API = "https://github.com/kubernetes-sigs/gateway-api/releases/download/v1.3.0/standard-install.yaml"

# Bounds of every wait, in seconds; stack config `timeouts` overrides any of them. Sized for
# real hardware: an installer pull + install to disk + reboot routinely takes several minutes,
# and so does a reset that wipes partitions; the apiserver answers minutes after bootstrap.
# The Talos ones come from kontinuum/talos/waits.py, where the providers' own bounds live.
DEFAULT_TIMEOUTS = {
    "discovery": 10,
    "claim": 0,
    "apply": int(WAIT_DEFAULTS.apply),
    "bootstrap": int(WAIT_DEFAULTS.bootstrap),
    "kubeconfig": int(WAIT_DEFAULTS.kubeconfig),
    "cilium": 600,
    "health": int(WAIT_DEFAULTS.health),
    "certManager": 600,
    "certificate": 600,
    "registryJoin": 600,
    "teardown": int(WAIT_DEFAULTS.reset),
}

# What a reset wipes on teardown (zones[].teardown.wipe). Talos's documented way back to
# maintenance mode wipes the STATE and EPHEMERAL partitions; `disk` wipes the whole system
# disk, which leaves a machine that boots only from the network or an ISO afterwards.
TEARDOWN_WIPES = ("state", "disk")

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")


@dataclass(frozen=True)
class ChartSource:
    chart: str
    namespace: str
    repo: str | None = None
    version: str | None = None
    path: str | None = None  # a local chart directory instead of repo/chart/version


@dataclass(frozen=True)
class Addon:
    source: ChartSource
    values: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Addons:
    cilium: Addon
    cert_manager: Addon
    gateway_api: str  # URL or local path of the standard-channel CRD bundle


@dataclass(frozen=True)
class Machine:
    addresses: tuple[str, ...]
    pool: str


@dataclass(frozen=True)
class Pool:
    name: str
    replicas: int
    install_disk: str = "/dev/sda"
    node_labels: dict = field(default_factory=dict)
    patches: tuple = ()


@dataclass(frozen=True)
class Zone:
    zone: str
    machines: tuple[Machine, ...]
    control_plane: Pool
    endpoint: str | None
    workers: tuple[Pool, ...]
    talos_version: str
    kubernetes_version: str
    addons: Addons
    patches: tuple
    unregister_instances_on_delete: bool
    server_image: str
    timeouts: dict
    skip_unreachable_cluster: bool  # teardown escape hatch: finish destroy with a dead cluster
    talos_port: int = 50000
    teardown_wipe: str = "state"  # one of TEARDOWN_WIPES


@dataclass(frozen=True)
class Auth:
    mode: str  # "anonymous" | "oidc"
    oidc_issuer_url: str | None = None
    oidc_client_id: str | None = None


@dataclass(frozen=True)
class Hub:
    dns_domain: str
    grpc_endpoint: str
    acme_email: str
    acme_server: str
    auth: Auth | None


@dataclass(frozen=True)
class StackConfig:
    region: str
    hub: Hub
    zones: tuple[Zone, ...]


class _Errors:
    """Collects problems with their paths; `problem()` keeps parsing so all are reported."""

    def __init__(self) -> None:
        self.items: list[ConfigError] = []

    def add(self, path: str, problem: str) -> None:
        self.items.append(ConfigError(path, problem))

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigErrors(self.items)


def _merge(base: Any, over: Any) -> Any:
    """Deep merge of mappings: zone settings win over `defaults`; lists are replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = copy.deepcopy(base)
        for k, v in over.items():
            out[k] = _merge(out.get(k), v) if k in out else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


def _str(raw: dict, key: str, path: str, errs: _Errors, *, required: bool = True, default: str | None = None):
    value = raw.get(key, default)
    if value is None:
        if required:
            errs.add(f"{path}{key}", "required")
        return None
    if not isinstance(value, str) or not value.strip():
        errs.add(f"{path}{key}", f"must be a non-empty string, got {value!r}")
        return None
    return value


def _name(value: Any, path: str, errs: _Errors) -> None:
    if isinstance(value, str) and not _NAME.match(value):
        errs.add(path, f"must be lowercase letters, digits and '-', at most 32 characters, got {value!r}")


def _address(value: Any, path: str, errs: _Errors) -> str | None:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value) or "/" in value:
        errs.add(path, f"must be an IP address or host name, got {value!r}")
        return None
    return value


def _parse_machines(raw: Any, path: str, pools: set[str], errs: _Errors) -> tuple[Machine, ...]:
    if not isinstance(raw, list) or not raw:
        errs.add(path, "must list at least one machine address")
        return ()
    out, seen = [], set()
    for i, entry in enumerate(raw):
        p = f"{path}[{i}]"
        if isinstance(entry, str):
            entry = {"address": entry}
        if not isinstance(entry, dict):
            errs.add(p, f"must be an address or a mapping with address/addresses and pool, got {entry!r}")
            continue
        addrs = entry.get("addresses", [entry["address"]] if "address" in entry else None)
        if not isinstance(addrs, list) or not addrs:
            errs.add(p, "needs `address` or a non-empty `addresses` list")
            continue
        good = [a for j, a in enumerate(addrs) if _address(a, f"{p}.addresses[{j}]" if "addresses" in entry else f"{p}.address", errs)]
        pool = entry.get("pool", CONTROL_PLANE_POOL)
        if pool not in pools:
            errs.add(f"{p}.pool", f"unknown pool {pool!r}; known: {', '.join(sorted(pools))}")
        if good and good[0] in seen:
            errs.add(p, f"address {good[0]} is listed twice")
        if good:
            seen.add(good[0])
            out.append(Machine(tuple(good), pool))
    return tuple(out)


def _parse_patches(raw: Any, path: str, errs: _Errors) -> tuple:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        errs.add(path, "must be a list of patches (JSON patch operation lists or YAML merge patch mappings)")
        return ()
    for i, patch in enumerate(raw):
        if not isinstance(patch, (dict, list)):
            errs.add(f"{path}[{i}]", "must be a mapping (merge patch) or a list of JSON patch operations")
    return tuple(raw)


def _parse_pool(raw: Any, path: str, name: str, errs: _Errors, *, control_plane: bool) -> Pool | None:
    if not isinstance(raw, dict):
        errs.add(path, "must be a mapping")
        return None
    replicas = raw.get("replicas", 1)
    if control_plane and replicas not in (1, 3, 5):
        errs.add(f"{path}.replicas", f"must be 1, 3 or 5, got {replicas!r}")
    elif not control_plane and (not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0):
        errs.add(f"{path}.replicas", f"must be a whole number >= 0, got {replicas!r}")
    disk = raw.get("installDisk", "/dev/sda")
    if not isinstance(disk, str) or not disk.startswith("/dev/"):
        errs.add(f"{path}.installDisk", f"must be a device path like /dev/sda, got {disk!r}")
    labels = raw.get("nodeLabels", {})
    if not isinstance(labels, dict):
        errs.add(f"{path}.nodeLabels", "must be a mapping of label: value")
        labels = {}
    return Pool(name, replicas if isinstance(replicas, int) else 0, disk, dict(labels),
                _parse_patches(raw.get("patches"), f"{path}.patches", errs))


def _parse_source(raw: Any, path: str, default: dict, errs: _Errors) -> ChartSource | None:
    raw = _merge(default, raw or {})
    if not isinstance(raw, dict):
        errs.add(path, "must be a mapping with repo/chart/version or path")
        return None
    if raw.get("path"):
        return ChartSource(chart=raw.get("chart") or "", namespace=raw["namespace"], path=raw["path"])
    for key in ("repo", "chart"):
        if not raw.get(key):
            errs.add(f"{path}.{key}", "required unless `path` points at a local chart")
    return ChartSource(chart=raw.get("chart", ""), namespace=raw["namespace"], repo=raw.get("repo"),
                       version=raw.get("version"))


def _parse_addons(raw: Any, path: str, errs: _Errors) -> Addons:
    raw = raw or {}
    if not isinstance(raw, dict):
        errs.add(path, "must be a mapping")
        raw = {}
    addons = {}
    for key in ("cilium", "certManager"):
        entry = raw.get(key) or {}
        source = _parse_source(entry.get("chart"), f"{path}.{key}.chart", DEFAULT_CHARTS[key], errs)
        values = entry.get("values", {})
        if not isinstance(values, dict):
            errs.add(f"{path}.{key}.values", "must be a mapping of chart values")
            values = {}
        addons[key] = Addon(source, values)
    gateway = (raw.get("gatewayApi") or {}).get("source", DEFAULT_GATEWAY_API)
    return Addons(addons["cilium"], addons["certManager"], gateway)


def _parse_endpoint(value: Any, path: str, errs: _Errors) -> str | None:
    if value is None:
        return None
    u = urlparse(value) if isinstance(value, str) else None
    if not u or u.scheme != "https" or not u.hostname or not u.port:
        errs.add(path, f"must be https://host:port (e.g. https://10.0.0.5:6443), got {value!r}")
        return None
    return value


def _parse_timeouts(raw: Any, path: str, errs: _Errors) -> dict:
    out = dict(DEFAULT_TIMEOUTS)
    for k, v in (raw or {}).items():
        if k not in DEFAULT_TIMEOUTS:
            errs.add(f"{path}.{k}", f"unknown timeout; known: {', '.join(DEFAULT_TIMEOUTS)}")
        elif not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            errs.add(f"{path}.{k}", f"must be a number of seconds >= 0, got {v!r}")
        else:
            out[k] = v
    return out


def _parse_zone(raw: Any, path: str, errs: _Errors) -> Zone | None:
    if not isinstance(raw, dict):
        errs.add(path, "must be a mapping")
        return None
    zone = _str(raw, "zone", f"{path}.", errs)
    _name(zone, f"{path}.zone", errs)
    cp = _parse_pool(raw.get("controlPlane", {}), f"{path}.controlPlane", CONTROL_PLANE_POOL, errs, control_plane=True)
    workers = []
    raw_workers = raw.get("workers", [])
    if not isinstance(raw_workers, list):
        errs.add(f"{path}.workers", "must be a list of pools")
        raw_workers = []
    names = {CONTROL_PLANE_POOL}
    for i, w in enumerate(raw_workers):
        wname = w.get("name") if isinstance(w, dict) else None
        if not wname:
            errs.add(f"{path}.workers[{i}].name", "required")
            continue
        _name(wname, f"{path}.workers[{i}].name", errs)
        if wname in names:
            errs.add(f"{path}.workers[{i}].name", f"duplicate pool name {wname!r}")
        names.add(wname)
        pool = _parse_pool(w, f"{path}.workers[{i}]", wname, errs, control_plane=False)
        if pool:
            workers.append(pool)
    machines = _parse_machines(raw.get("talosAddresses"), f"{path}.talosAddresses", names, errs)
    endpoint = _parse_endpoint(raw.get("controlPlane", {}).get("endpoint") if isinstance(raw.get("controlPlane"), dict)
                               else None, f"{path}.controlPlane.endpoint", errs)
    if cp and cp.replicas > 1 and endpoint is None:
        errs.add(f"{path}.controlPlane.endpoint",
                 "required with several control planes (a VIP or load balancer in front of them, https://host:6443)")
    for v, key in ((raw.get("talosVersion", TALOS_VERSION), "talosVersion"),
                   (raw.get("kubernetesVersion", DEFAULT_KUBERNETES_VERSION), "kubernetesVersion")):
        if not isinstance(v, str) or not re.match(r"^v\d+\.\d+\.\d+$", v):
            errs.add(f"{path}.{key}", f"must look like v1.2.3, got {v!r}")
    unregister = raw.get("unregisterInstancesOnDelete", False)
    if not isinstance(unregister, bool):
        errs.add(f"{path}.unregisterInstancesOnDelete", f"must be true or false, got {unregister!r}")
    teardown = raw.get("teardown") or {}
    if not isinstance(teardown, dict):
        errs.add(f"{path}.teardown", "must be a mapping (skipUnreachableCluster, wipe)")
        teardown = {}
    skip = teardown.get("skipUnreachableCluster", False)
    if not isinstance(skip, bool):
        errs.add(f"{path}.teardown.skipUnreachableCluster", f"must be true or false, got {skip!r}")
    wipe = teardown.get("wipe", "state")
    if wipe not in TEARDOWN_WIPES:
        errs.add(f"{path}.teardown.wipe", f"must be one of {', '.join(TEARDOWN_WIPES)}, got {wipe!r}")
        wipe = "state"
    port = raw.get("talosPort", 50000)
    if not isinstance(port, int) or not 0 < port < 65536:
        errs.add(f"{path}.talosPort", f"must be a TCP port, got {port!r}")
    if zone is None or cp is None:
        return None
    return Zone(
        zone=zone, machines=machines, control_plane=cp, endpoint=endpoint, workers=tuple(workers),
        talos_version=raw.get("talosVersion", TALOS_VERSION),
        kubernetes_version=raw.get("kubernetesVersion", DEFAULT_KUBERNETES_VERSION),
        addons=_parse_addons(raw.get("addons"), f"{path}.addons", errs),
        patches=_parse_patches(raw.get("patches"), f"{path}.patches", errs),
        unregister_instances_on_delete=bool(unregister), server_image=raw.get("serverImage", DEFAULT_SERVER_IMAGE),
        timeouts=_parse_timeouts(raw.get("timeouts"), f"{path}.timeouts", errs),
        skip_unreachable_cluster=bool(skip), talos_port=port if isinstance(port, int) else 50000,
        teardown_wipe=wipe,
    )


def _parse_hub(raw: Any, errs: _Errors) -> Hub | None:
    if not isinstance(raw, dict):
        errs.add("hub", "required: dnsDomain, grpcEndpoint, acme and auth of the hub")
        return None
    domain = _str(raw, "dnsDomain", "hub.", errs)
    grpc = _str(raw, "grpcEndpoint", "hub.", errs)
    if grpc and ("://" in grpc or ":" not in grpc):
        errs.add("hub.grpcEndpoint", f"must be host:port (no scheme), got {grpc!r}")
    acme = raw.get("acme") or {}
    email = _str(acme, "email", "hub.acme.", errs)
    server = _str(acme, "server", "hub.acme.", errs, default=LETSENCRYPT)
    if email and "@" not in email:
        errs.add("hub.acme.email", f"must be an e-mail address, got {email!r}")
    auth = None
    raw_auth = raw.get("auth")
    if isinstance(raw_auth, dict):
        mode = raw_auth.get("mode")
        if mode == "anonymous":
            auth = Auth("anonymous")
        elif mode == "oidc":
            oidc = raw_auth.get("oidc") or {}
            issuer = _str(oidc, "issuerUrl", "hub.auth.oidc.", errs)
            client_id = _str(oidc, "clientId", "hub.auth.oidc.", errs)
            if issuer and urlparse(issuer).scheme != "https":
                errs.add("hub.auth.oidc.issuerUrl", f"must be an https URL, got {issuer!r}")
            auth = Auth("oidc", issuer, client_id)
        else:
            errs.add("hub.auth.mode", f"must be anonymous or oidc, got {mode!r}")
    elif raw_auth is not None:
        errs.add("hub.auth", "must be a mapping with mode: anonymous | oidc")
    if None in (domain, grpc, email, server):
        return None
    return Hub(domain, grpc, email, server, auth)


def parse(raw: dict) -> StackConfig:
    """Validate the whole `kontinuum:` config; raises ConfigErrors listing every problem."""
    errs = _Errors()
    region = _str(raw, "region", "", errs)
    _name(region, "region", errs)
    hub = _parse_hub(raw.get("hub"), errs)
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        errs.add("defaults", "must be a mapping of zone settings")
        defaults = {}
    raw_zones = raw.get("zones", [])
    if not isinstance(raw_zones, list):
        errs.add("zones", "must be a list")
        raw_zones = []
    zones, seen, addresses = [], set(), {}
    for i, rz in enumerate(raw_zones):
        z = _parse_zone(_merge(defaults, rz) if isinstance(rz, dict) else rz, f"zones[{i}]", errs)
        if z is None:
            continue
        if z.zone in seen:
            errs.add(f"zones[{i}].zone", f"zone {z.zone!r} is listed twice")
        seen.add(z.zone)
        for m in z.machines:
            if m.addresses[0] in addresses:
                errs.add(f"zones[{i}].talosAddresses", f"{m.addresses[0]} is already used by zone {addresses[m.addresses[0]]}")
            addresses[m.addresses[0]] = z.zone
        zones.append(z)
    if zones and hub is not None and hub.auth is None:
        errs.add("hub.auth", "not configured: a zone's kontinuum-server refuses to start without the hub's auth "
                 "choice; set hub.auth.mode to anonymous or oidc")
    errs.raise_if_any()
    assert region is not None and hub is not None
    return StackConfig(region, hub, tuple(zones))


def is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return False
