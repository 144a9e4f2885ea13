"""Gateway (lab stand-in): plays Cilium v1.18.4's Gateway API operator, its LB-IPAM and L2
announcer, and Envoy's HTTP data plane, for one zone cluster.

What it plays, from the cluster's real `cilium-config` ConfigMap (rendered by the Cilium chart):
- the operator registering its CiliumLoadBalancerIPPool (cilium.io/v2) and
  CiliumL2AnnouncementPolicy (cilium.io/v2alpha1) CRDs, read from the upstream Go module;
- the GatewayClass controller `io.cilium/gateway-controller` (Accepted);
- the Gateway reconciler: the `cilium-gateway-<name>` Service (ClusterIP with
  `gateway-api-hostnetwork-enabled`, LoadBalancer otherwise; `spec.addresses` → the
  `io.cilium/lb-ipam-ips` annotation), Accepted, and Programmed with the Service's load-balancer
  addresses. As in 1.18.x, a host-network Gateway gets no status address and stays
  Programmed=False "Gateway waiting for address" (cilium/cilium#42786) although Envoy serves it;
- LB-IPAM: LoadBalancer Services get addresses from the enabled pools that select them, honouring
  a requested address, with Cilium's `cilium.io/IPAMRequestSatisfied` condition; no pool, no address;
- Envoy: HTTP listeners on the Ready nodes' InternalIPs that match
  `gateway-api-hostnetwork-nodelabelselector` (host-network mode), or on a pool address once
  `enable-l2-announcements` is on and a CiliumL2AnnouncementPolicy with `loadBalancerIPs: true`
  selects the Service and a Ready node (interfaces are not checked: the lab's are loopback);
  requests are routed by the HTTPRoutes attached to the Gateway; a cert-manager HTTP-01 solver
  backend answers `/.well-known/acme-challenge/<token>` with the key authorization of the
  acme.cert-manager.io/v1 Challenge whose spec.token and spec.dnsName match (what the acmesolver
  pod would serve); any other backend answers 503 (no pod really runs).
It does not play TLS listeners, BGP, IPv6 NDP, pool conflicts between pools or sharing keys.
"""

from __future__ import annotations

import copy
from pathlib import Path

from kubernetes import client

from kontinuum.kube import watching
from kontinuum.talos import pki
from lab.standins import cilium_crds, gateway_model as m
from lab.standins.gateway_http import DataPlane
from lab.standins.loop import REQUEST_TIMEOUT, STANDIN_ANNOTATION, PollingStandin, api_client

GW = ("gateway.networking.k8s.io", "v1")
POOLS = ("cilium.io", "v2", "ciliumloadbalancerippools")
POLICIES = ("cilium.io", "v2alpha1", "ciliuml2announcementpolicies")
CHALLENGES = ("acme.cert-manager.io", "v1", "challenges")
CHALLENGE_PATH = "/.well-known/acme-challenge/"
STANDIN_NOTE = "created by the lab Gateway stand-in (plays the Cilium operator)"


def _now() -> str:
    return pki.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(type_: str, ok: bool, reason: str, message: str, gen, previous: list[dict]) -> dict:
    status = "True" if ok else "False"
    old = next((c for c in previous if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == status and old.get("lastTransitionTime") else _now()
    out = {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since}
    if gen:  # Services carry no generation; the API drops a zero
        out["observedGeneration"] = gen
    return out


def _same(a, b) -> bool:
    """Equal but for lastTransitionTime."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "lastTransitionTime"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return strip(a) == strip(b)


class GatewayStandin(PollingStandin):
    """Cilium's Gateway API + LB-IPAM + Envoy (lab stand-in) for one zone cluster."""

    name = "gateway"

    def __init__(self, kubeconfig: str | Path, *, interval: float = 5.0, cluster: str = "zone",
                 crds: list[dict] | None = None):
        super().__init__(interval)  # a fallback: every object it reads is watched
        self.cluster = cluster
        self._kubeconfig = kubeconfig.read_text() if isinstance(kubeconfig, Path) else kubeconfig
        self.api = api_client(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self._crds = crds
        self._crds_registered = False
        self.data_plane = DataPlane(self._answer)

    def close(self) -> None:
        self.data_plane.stop()
        self.api.close()

    # -- reads ---------------------------------------------------------------------------------

    def _list(self, group: str, version: str, plural: str, namespace: str | None = None) -> list[dict]:
        try:
            if namespace:
                out = self.custom.list_namespaced_custom_object(group, version, namespace, plural,
                                                                _request_timeout=REQUEST_TIMEOUT)
            else:
                out = self.custom.list_cluster_custom_object(group, version, plural, _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as e:
            if e.status == 404:  # the CRD is not there (yet)
                return []
            raise
        return out.get("items") or []

    def _cilium_config(self) -> m.CiliumConfig | None:
        items = self.core.list_config_map_for_all_namespaces(field_selector="metadata.name=cilium-config",
                                                             _request_timeout=REQUEST_TIMEOUT).items
        return m.CiliumConfig.of(items[0].data) if items else None

    def _plain(self, objs) -> list[dict]:
        return [self.api.sanitize_for_serialization(o) for o in objs]

    # -- the loop ------------------------------------------------------------------------------

    def watched(self) -> list[tuple[str, watching.Source]]:
        core = [("list_config_map_for_all_namespaces", {"field_selector": "metadata.name=cilium-config"}),
                ("list_node", {}), ("list_service_for_all_namespaces", {})]
        custom = [(*GW, "gatewayclasses"), (*GW, "gateways"), (*GW, "httproutes"), POOLS, POLICIES]
        return ([(self._kubeconfig, watching.Source(client.CoreV1Api, method, (), kwargs)) for method, kwargs in core]
                + [(self._kubeconfig, watching.custom_objects(*c)) for c in custom])

    def poll(self) -> None:
        cfg = self._cilium_config()
        if cfg is None or not cfg.gateway_api:
            self.data_plane.apply({})  # no Cilium, or its Gateway API off: nobody programs Gateways
            return
        self._register_crds()
        classes = {c["metadata"]["name"] for c in self._list(*GW, "gatewayclasses")
                   if self._accept_class(c)}
        gateways = [g for g in self._list(*GW, "gateways") if (g.get("spec") or {}).get("gatewayClassName") in classes]
        nodes = self._plain(self.core.list_node(_request_timeout=REQUEST_TIMEOUT).items)
        for gw in gateways:
            self._ensure_service(gw, cfg)
        services = self._lbipam(self._list(*POOLS))
        policies = self._list(*POLICIES)
        httproutes = self._list(*GW, "httproutes")
        table: dict = {}
        for gw in gateways:
            md = gw["metadata"]
            svc = services.get((md["namespace"], m.service_name(md["name"])))
            self._gateway_status(gw, svc, httproutes)
            if cfg.host_network:
                addresses = [ip for n in nodes if m.node_ready(n) and (ip := m.node_internal_ip(n))
                             and m.selector_matches({"matchLabels": cfg.host_network_nodes},
                                                    (n.get("metadata") or {}).get("labels"))]
            elif svc is not None and cfg.l2_announcements and m.l2_announced(svc, policies, nodes):
                addresses = [a["value"] for a in m.gateway_addresses(svc) if a["type"] == "IPAddress"]
            else:
                addresses = []
            routes = m.routes_of(gw, httproutes)
            for listener in (gw.get("spec") or {}).get("listeners") or []:
                if listener.get("protocol") != "HTTP":
                    continue
                for ip in addresses:
                    table.setdefault((ip, int(listener["port"])), [])
                    table[(ip, int(listener["port"]))] += [r for r in routes if r.port == int(listener["port"])]
        self.data_plane.apply(table)

    def _register_crds(self) -> None:
        if self._crds_registered:
            return
        from lab import crds as lab_crds

        manifests = self._crds if self._crds is not None else cilium_crds.crds()
        lab_crds.apply(self.api, copy.deepcopy(manifests))
        self._crds_registered = True
        self.log.info("(lab stand-in) %s: registered the Cilium LB-IPAM and L2 announcement CRDs", self.cluster)

    def _accept_class(self, gc: dict) -> bool:
        if (gc.get("spec") or {}).get("controllerName") != m.CONTROLLER:
            return False
        previous = (gc.get("status") or {}).get("conditions") or []
        want = [_condition("Accepted", True, "Accepted", "Valid GatewayClass", gc["metadata"].get("generation"),
                           previous)]
        if not _same(previous, want):
            self.custom.patch_cluster_custom_object_status(*GW, "gatewayclasses", gc["metadata"]["name"],
                                                           {"status": {"conditions": want}},
                                                           _request_timeout=REQUEST_TIMEOUT)
        return True

    def _ensure_service(self, gw: dict, cfg: m.CiliumConfig) -> None:
        want = m.desired_service(gw, cfg)
        want["metadata"]["annotations"][STANDIN_ANNOTATION] = STANDIN_NOTE
        md = want["metadata"]
        try:
            have = self.core.read_namespaced_service(md["name"], md["namespace"], _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as e:
            if e.status != 404:
                raise
            self.core.create_namespaced_service(md["namespace"], want, _request_timeout=REQUEST_TIMEOUT)
            self.log.info("(lab stand-in) %s: created Service %s/%s (%s)", self.cluster, md["namespace"], md["name"],
                          want["spec"]["type"])
            return
        have_ports = sorted(p.port for p in have.spec.ports or [])
        if (have.spec.type != want["spec"]["type"] or have_ports != [p["port"] for p in want["spec"]["ports"]]
                or (have.metadata.annotations or {}).get(m.LB_IPS_ALIAS) != md["annotations"].get(m.LB_IPS_ALIAS)):
            # Service type changes are refused in place for some pairs: replace it, as a re-created
            # Gateway Service would be.
            self.core.delete_namespaced_service(md["name"], md["namespace"], _request_timeout=REQUEST_TIMEOUT)
            self.core.create_namespaced_service(md["namespace"], want, _request_timeout=REQUEST_TIMEOUT)
            self.log.info("(lab stand-in) %s: replaced Service %s/%s (%s)", self.cluster, md["namespace"],
                          md["name"], want["spec"]["type"])

    def _lbipam(self, pools: list[dict]) -> dict[tuple[str, str], dict]:
        """Assign pool addresses to every LoadBalancer Service; returns all Services by (ns, name)."""
        services = self._plain(self.core.list_service_for_all_namespaces(_request_timeout=REQUEST_TIMEOUT).items)
        services.sort(key=lambda s: (s["metadata"].get("creationTimestamp") or "", s["metadata"]["name"]))
        current = {(s["metadata"]["namespace"], s["metadata"]["name"]):
                   {i.get("ip") for i in ((s.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
                    if i.get("ip")} for s in services}
        out = {}
        for svc in services:
            key = (svc["metadata"]["namespace"], svc["metadata"]["name"])
            out[key] = svc
            if not m.handled_by_lbipam(svc):
                continue
            taken = set().union(*(ips for k, ips in current.items() if k != key))
            alloc = m.allocate(svc, pools, taken)
            status = svc.get("status") or {}
            previous = status.get("conditions") or []
            cond = _condition(m.SATISFIED, alloc.satisfied, alloc.reason, alloc.message,
                              svc["metadata"].get("generation"), previous)
            want = {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"} for ip in alloc.ips]},
                    "conditions": [c for c in previous if c.get("type") != m.SATISFIED] + [cond]}
            have = {"loadBalancer": {"ingress": (status.get("loadBalancer") or {}).get("ingress") or []},
                    "conditions": previous}
            if not _same(have, want):
                self.core.patch_namespaced_service_status(key[1], key[0], {"status": want},
                                                          _request_timeout=REQUEST_TIMEOUT)
                self.log.info("(lab stand-in) %s: LB-IPAM %s/%s: %s", self.cluster, *key,
                              ", ".join(alloc.ips) or f"{alloc.reason} ({alloc.message})")
                svc["status"] = {**status, **want}
            current[key] = set(alloc.ips)
        return out

    def _gateway_status(self, gw: dict, svc: dict | None, httproutes: list[dict]) -> None:
        md, gen = gw["metadata"], gw["metadata"].get("generation")
        previous = (gw.get("status") or {}).get("conditions") or []
        ok, reason, message, addresses = m.programmed(gw, svc)
        conditions = [_condition("Accepted", True, "Accepted", "Gateway successfully scheduled", gen, previous),
                      _condition("Programmed", ok, reason, message, gen, previous)]
        routes = m.routes_of(gw, httproutes)
        listeners = []
        for listener in (gw.get("spec") or {}).get("listeners") or []:
            old = next((s.get("conditions") or [] for s in (gw.get("status") or {}).get("listeners") or []
                        if s.get("name") == listener.get("name")), [])
            attached = len({(r.hostnames, r.path) for r in routes if r.port == int(listener["port"])})
            listeners.append({
                "name": listener["name"], "attachedRoutes": attached,
                "supportedKinds": [{"group": GW[0], "kind": "HTTPRoute"}],
                "conditions": [_condition("Accepted", True, "Accepted", "Listener Accepted", gen, old),
                               _condition("Programmed", ok, "Programmed" if ok else "Pending",
                                          "Listener Programmed" if ok else "Listener not programmed", gen, old),
                               _condition("ResolvedRefs", True, "ResolvedRefs", "Resolved Refs", gen, old)]})
        want = {"conditions": conditions, "addresses": addresses, "listeners": listeners}
        have = {k: (gw.get("status") or {}).get(k) or [] for k in want}
        if not _same(have, want):
            self.custom.patch_namespaced_custom_object_status(*GW, md["namespace"], "gateways", md["name"],
                                                              {"status": want}, _request_timeout=REQUEST_TIMEOUT)
            self.log.info("(lab stand-in) %s: Gateway %s/%s Programmed=%s (%s) addresses=%s", self.cluster,
                          md["namespace"], md["name"], ok, message, [a["value"] for a in addresses])

    # -- the data plane's backends -------------------------------------------------------------

    def _answer(self, route: m.Route, host: str, path: str) -> tuple[int, str]:
        if route.backend is None:
            return 500, ""
        ns, name, _port = route.backend
        try:
            svc = self.core.read_namespaced_service(name, ns, _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as e:
            if e.status == 404:
                return 500, ""  # Envoy: the route's cluster does not exist
            raise
        if (svc.metadata.labels or {}).get(m.SOLVER_LABEL) != "true":
            return 503, "no healthy upstream"  # backend pods are kwok-played: nothing really serves
        if not path.startswith(CHALLENGE_PATH):
            return 404, ""
        token = path[len(CHALLENGE_PATH):]
        for ch in self._list(*CHALLENGES, namespace=ns):
            spec = ch.get("spec") or {}
            if spec.get("type") == "HTTP-01" and spec.get("token") == token and spec.get("dnsName") == host:
                return 200, spec.get("key") or ""
        return 404, ""
