"""Pure decisions of the Gateway stand-in (lab/standins/gateway.py), as Cilium v1.18.4 makes them.

Facts read from github.com/cilium/cilium@v1.18.4 (operator/pkg/gateway-api, operator/pkg/lbipam,
operator/pkg/model): the Gateway's Service is `cilium-gateway-<name>`, labelled
`io.cilium.gateway/owning-gateway`, type ClusterIP in host-network mode and LoadBalancer otherwise;
`spec.addresses` become the Service annotation `io.cilium/lb-ipam-ips` unless
`spec.infrastructure.annotations` already sets it; the Gateway's status addresses are copied from
the Service's `status.loadBalancer.ingress` only, so a host-network Gateway (ClusterIP Service)
stays Programmed=False "Gateway waiting for address" in 1.18.x (cilium/cilium#42786, fixed in
1.19); LB-IPAM serves a Service from the enabled pools whose serviceSelector matches it (plus the
`io.kubernetes.service.namespace/name` pseudo labels) and reports `cilium.io/IPAMRequestSatisfied`.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from lab import api_json

CONTROLLER = "io.cilium/gateway-controller"
SERVICE_PREFIX = "cilium-gateway-"
OWNING_GATEWAY_LABEL = "io.cilium.gateway/owning-gateway"
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
LB_IPS_ANNOTATIONS = ("lbipam.cilium.io/ips", "io.cilium/lb-ipam-ips")
LB_IPS_ALIAS = "io.cilium/lb-ipam-ips"  # what Cilium's ingestion writes from spec.addresses
LB_CLASSES = (None, "io.cilium/l2-announcer", "io.cilium/bgp-control-plane")
SATISFIED = "cilium.io/IPAMRequestSatisfied"
NS_LABEL = "io.kubernetes.service.namespace"
NAME_LABEL = "io.kubernetes.service.name"
SOLVER_LABEL = "acme.cert-manager.io/http01-solver"

IP = ipaddress.IPv4Address | ipaddress.IPv6Address


# -- cilium-config ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CiliumConfig:
    """What the operator and agents read from the cilium-config ConfigMap."""

    gateway_api: bool = False
    host_network: bool = False
    host_network_nodes: dict | None = None  # matchLabels; {} = all nodes
    l2_announcements: bool = False

    @classmethod
    def of(cls, data: dict | None) -> "CiliumConfig":
        d = data or {}
        return cls(gateway_api=d.get("enable-gateway-api") == "true",
                   host_network=d.get("gateway-api-hostnetwork-enabled") == "true",
                   host_network_nodes=parse_label_list(d.get("gateway-api-hostnetwork-nodelabelselector", "")),
                   l2_announcements=d.get("enable-l2-announcements") == "true")


def parse_label_list(text: str) -> dict:
    """`k=v,k2=v2` (the chart's mapToString of matchLabels) → {k: v, k2: v2}."""
    out = {}
    for part in (text or "").split(","):
        if part.strip():
            k, _, v = part.strip().partition("=")
            out[k] = v
    return out


# -- label selectors ---------------------------------------------------------------------------


def selector_matches(selector: dict | None, labels: dict | None) -> bool:
    """A metav1.LabelSelector; None selects everything, as Cilium's pools and policies treat it."""
    if selector is None:
        return True
    labels = labels or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def service_selection_labels(svc: dict) -> dict:
    md = svc.get("metadata") or {}
    return {**(md.get("labels") or {}), NS_LABEL: md.get("namespace", ""), NAME_LABEL: md.get("name", "")}


def node_internal_ip(node: dict) -> str | None:
    for a in (node.get("status") or {}).get("addresses") or []:
        if a.get("type") == "InternalIP":
            return a.get("address")
    return None


node_ready = api_json.is_ready


# -- the Gateway's Service ---------------------------------------------------------------------


def service_name(gateway_name: str) -> str:
    return (SERVICE_PREFIX + gateway_name)[:63]


def desired_service(gw: dict, cfg: CiliumConfig) -> dict:
    """The Service Cilium's translator creates for a Gateway (ports from its listeners)."""
    md, spec = gw["metadata"], gw.get("spec") or {}
    infra = spec.get("infrastructure") or {}
    annotations = dict(infra.get("annotations") or {})
    ips = [a["value"] for a in spec.get("addresses") or [] if a.get("value")]
    if ips and not annotations.get(LB_IPS_ALIAS):
        annotations[LB_IPS_ALIAS] = ",".join(ips)
    ports = sorted({int(l["port"]) for l in spec.get("listeners") or []})
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service_name(md["name"]), "namespace": md["namespace"],
                     "labels": {OWNING_GATEWAY_LABEL: md["name"], GATEWAY_NAME_LABEL: md["name"],
                                **(infra.get("labels") or {})},
                     "annotations": annotations,
                     "ownerReferences": [{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                                          "name": md["name"], "uid": md["uid"], "controller": True}]},
        "spec": {"type": "ClusterIP" if cfg.host_network else "LoadBalancer",
                 "ports": [{"name": f"port-{p}", "port": p, "protocol": "TCP"} for p in ports]},
    }


# -- LB-IPAM -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    first: IP
    last: IP

    def __contains__(self, ip: IP) -> bool:
        return ip.version == self.first.version and self.first <= ip <= self.last

    def addresses(self):
        ip = self.first
        while ip <= self.last:
            yield ip
            ip = ip + 1


def pool_blocks(pool: dict) -> list[Block]:
    """A CiliumLoadBalancerIPPool's allocatable blocks (`cidr` or `start`/`stop`; allowFirstLastIPs)."""
    spec = pool.get("spec") or {}
    skip_ends = spec.get("allowFirstLastIPs") == "No"
    out = []
    for b in spec.get("blocks") or []:
        try:
            if b.get("cidr"):
                net = ipaddress.ip_network(b["cidr"], strict=False)
                first, last = net.network_address, net.broadcast_address
                if skip_ends and net.num_addresses > 2:
                    first, last = first + 1, last - 1
            else:
                first = ipaddress.ip_address(b["start"])
                last = ipaddress.ip_address(b.get("stop") or b["start"])
        except (KeyError, ValueError):
            continue  # Cilium marks such a pool with a condition; it offers nothing
        out.append(Block(first, last))
    return out


def requested_ips(svc: dict) -> list[str]:
    ann = (svc.get("metadata") or {}).get("annotations") or {}
    for key in LB_IPS_ANNOTATIONS:
        if ann.get(key):
            return [v.strip() for v in ann[key].split(",") if v.strip()]
    return []


def handled_by_lbipam(svc: dict) -> bool:
    spec = svc.get("spec") or {}
    return spec.get("type") == "LoadBalancer" and spec.get("loadBalancerClass") in LB_CLASSES


@dataclass(frozen=True)
class Allocation:
    ips: tuple[str, ...]
    satisfied: bool
    reason: str
    message: str


def allocate(svc: dict, pools: list[dict], taken: set[str]) -> Allocation:
    """LB-IPAM's answer for one Service: keep a valid assignment, honour a requested IP, else the
    first free address of the first matching pool (pools by name, as a stable order)."""
    labels = service_selection_labels(svc)
    matching = [p for p in sorted(pools, key=lambda p: p["metadata"]["name"])
                if selector_matches((p.get("spec") or {}).get("serviceSelector"), labels)]
    enabled = [p for p in matching if not (p.get("spec") or {}).get("disabled")]
    current = [i.get("ip") for i in ((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
               if i.get("ip")]
    requested = requested_ips(svc)
    if requested:
        for raw in requested:
            try:
                ip = ipaddress.ip_address(raw)
            except ValueError:
                return Allocation((), False, "invalid_ip", f"Invalid requested IP '{raw}'")
            if not any(ip in b for p in matching for b in pool_blocks(p)):
                in_other = any(ip in b for p in pools for b in pool_blocks(p))
                return Allocation((), False, "pool_selector_mismatch" if in_other else "no_pool",
                                  f"The pool with the CIDR containing '{raw}', doesn't select this service"
                                  if in_other else f"No pool exists with a CIDR containing '{raw}'")
            if raw in taken and raw not in current:
                return Allocation((), False, "already_allocated",
                                  f"The IP '{raw}' is already allocated to another service")
        return Allocation(tuple(requested), True, "satisfied", "")
    if current and all(any(ipaddress.ip_address(c) in b for p in matching for b in pool_blocks(p))
                       for c in current):
        return Allocation(tuple(current), True, "satisfied", "")
    for p in enabled:
        for block in pool_blocks(p):
            for ip in block.addresses():
                if str(ip) not in taken:
                    return Allocation((str(ip),), True, "satisfied", "")
    if not matching:
        return Allocation((), False, "no_pool", "There are no enabled CiliumLoadBalancerIPPools that match this service")
    return Allocation((), False, "out_of_ips", "No more IPs available in the matching pools")


def l2_announced(svc: dict, policies: list[dict], nodes: list[dict]) -> bool:
    """A CiliumL2AnnouncementPolicy with loadBalancerIPs: true selects the Service and a Ready node."""
    labels = service_selection_labels(svc)
    for p in policies:
        spec = p.get("spec") or {}
        if not spec.get("loadBalancerIPs") or not selector_matches(spec.get("serviceSelector"), labels):
            continue
        if any(node_ready(n) and selector_matches(spec.get("nodeSelector"), (n.get("metadata") or {}).get("labels"))
               for n in nodes):
            return True
    return False


# -- Gateway status ----------------------------------------------------------------------------


def gateway_addresses(svc: dict | None) -> list[dict]:
    ingress = (((svc or {}).get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    out = [{"type": "IPAddress", "value": i["ip"]} for i in ingress if i.get("ip")]
    out += [{"type": "Hostname", "value": i["hostname"]} for i in ingress if i.get("hostname")]
    return out


def programmed(gw: dict, svc: dict | None) -> tuple[bool, str, str, list[dict]]:
    """(Programmed, reason, message, status addresses) as Cilium 1.18.4's reconciler ends."""
    addresses = gateway_addresses(svc)
    if not addresses:
        return False, "AddressNotAssigned", "Gateway waiting for address", []
    got = {a["value"] for a in addresses}
    for a in (gw.get("spec") or {}).get("addresses") or []:
        if a.get("value") not in got:
            return False, "AddressNotUsable", "StaticAddress can't be used", addresses
    return True, "Programmed", "Gateway Programmed", addresses


# -- routing (the data plane) ------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    port: int
    listener_host: str | None
    hostnames: tuple[str, ...]
    path_type: str
    path: str
    backend: tuple[str, str, int] | None  # (namespace, service, port)


def _host_matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and host.count(".") >= pattern.count(".")
    return host == pattern


def _attaches(ref: dict, route_ns: str, gw: dict, listener: dict) -> bool:
    md = gw["metadata"]
    if (ref.get("kind") or "Gateway") != "Gateway" or (ref.get("group") or "gateway.networking.k8s.io") != \
            "gateway.networking.k8s.io":
        return False
    if ref.get("name") != md["name"] or (ref.get("namespace") or route_ns) != md["namespace"]:
        return False
    if ref.get("sectionName") and ref["sectionName"] != listener.get("name"):
        return False
    if ref.get("port") and int(ref["port"]) != int(listener["port"]):
        return False
    allowed = ((listener.get("allowedRoutes") or {}).get("namespaces") or {}).get("from") or "Same"
    return allowed == "All" or (allowed == "Same" and route_ns == md["namespace"])


def routes_of(gw: dict, httproutes: list[dict]) -> list[Route]:
    """The HTTP listeners' routes from the HTTPRoutes attached to this Gateway."""
    out = []
    for listener in (gw.get("spec") or {}).get("listeners") or []:
        if listener.get("protocol") != "HTTP":
            continue
        for hr in httproutes:
            ns, spec = hr["metadata"]["namespace"], hr.get("spec") or {}
            if not any(_attaches(ref, ns, gw, listener) for ref in spec.get("parentRefs") or []):
                continue
            for rule in spec.get("rules") or [{}]:
                refs = rule.get("backendRefs") or []
                backend = None
                if refs and (refs[0].get("kind") or "Service") == "Service":
                    backend = (refs[0].get("namespace") or ns, refs[0]["name"], int(refs[0].get("port") or 0))
                for m in rule.get("matches") or [{}]:
                    path = m.get("path") or {}
                    out.append(Route(int(listener["port"]), listener.get("hostname"), tuple(spec.get("hostnames") or ()),
                                     path.get("type") or "PathPrefix", path.get("value") or "/", backend))
    return out


def _path_matches(route: Route, path: str) -> bool:
    if route.path_type == "Exact":
        return path == route.path
    prefix = route.path.rstrip("/")
    return path == prefix or path.startswith(prefix + "/") or prefix == ""


def match(routes: list[Route], port: int, host: str, path: str) -> Route | None:
    """Exact paths win over prefixes, longer prefixes over shorter ones (Gateway API precedence)."""
    host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    candidates = [r for r in routes if r.port == port
                  and (r.listener_host is None or _host_matches(r.listener_host, host))
                  and (not r.hostnames or any(_host_matches(h, host) for h in r.hostnames))
                  and _path_matches(r, path)]
    candidates.sort(key=lambda r: (r.path_type != "Exact", -len(r.path)))
    return candidates[0] if candidates else None
