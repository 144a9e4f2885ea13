"""Zone DNS records in the lab's DNS server (lab stand-in for the site operator).

A zone with `dns: manual` exports the record to create (its host, `<zone>.<region>.<domain>`,
and the Gateway's reachable addresses); at a real site someone creates it. The lab plays that
person for the lab's DNS server (pebble-challtestsrv, lab/acme.py), so Pebble and cert-manager's
HTTP-01 self check can resolve the host: for each Gateway that names hostnames on its
listeners, the hostnames get A records for the addresses the Gateway is reachable at, which
are what Cilium would make them:
- the Gateway's status addresses (LB-IPAM: its LoadBalancer Service's address);
- in host-network mode (cilium-config `gateway-api-hostnetwork-enabled`), where Cilium 1.18 puts
  no address in the status, the InternalIPs of the Ready nodes Envoy listens on (those matching
  `gateway-api-hostnetwork-nodelabelselector`).
A Gateway with neither gets no record (nothing could be reached), and a record whose Gateway
went away is cleared. The lab's DNS serves the lab's own domain only (kontinuum.test by
default): a zone under any other domain is published by nobody, so its host does not resolve.
"""

from __future__ import annotations

import logging
from typing import Protocol

from kubernetes import client

from lab.standins import gateway_model as m
from lab.standins.loop import REQUEST_TIMEOUT

log = logging.getLogger(__name__)

GW = ("gateway.networking.k8s.io", "v1", "gateways")


class Records(Protocol):
    def set_a(self, host: str, addresses: list[str]) -> None: ...
    def clear_a(self, host: str) -> None: ...


# -- pure -----------------------------------------------------------------------------------


def host_network_ips(nodes: list[dict], cfg: m.CiliumConfig) -> list[str]:
    """Where Envoy listens in host-network mode: the matching Ready nodes' InternalIPs."""
    return sorted(ip for n in nodes if m.node_ready(n) and (ip := m.node_internal_ip(n))
                  and m.selector_matches({"matchLabels": cfg.host_network_nodes}, (n.get("metadata") or {}).get("labels")))


def gateway_records(gateway: dict, host_network: bool, node_ips: list[str]) -> dict[str, list[str]]:
    hosts = sorted({ln["hostname"] for ln in (gateway.get("spec") or {}).get("listeners") or [] if ln.get("hostname")})
    addresses = sorted(a["value"] for a in ((gateway.get("status") or {}).get("addresses") or [])
                       if a.get("type", "IPAddress") == "IPAddress" and a.get("value"))
    if not addresses and host_network:
        addresses = node_ips
    return {h: addresses for h in hosts} if addresses else {}


# -- I/O ------------------------------------------------------------------------------------


class ZoneDns:
    """Keeps one cluster's Gateway host records in `records`; reconcile() from the runner's thread."""

    def __init__(self, records: Records, *, cluster: str, domain: str = "kontinuum.test"):
        self.records = records
        self.cluster = cluster
        self.domain = domain.strip(".").lower()
        self.published: dict[str, list[str]] = {}

    def reconcile(self, api: client.ApiClient) -> None:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        try:
            gateways = custom.list_cluster_custom_object(*GW, _request_timeout=REQUEST_TIMEOUT)["items"]
        except client.ApiException as e:
            if e.status != 404:  # no Gateway API yet: nothing to publish
                raise
            gateways = []
        maps = core.list_config_map_for_all_namespaces(field_selector="metadata.name=cilium-config",
                                                       _request_timeout=REQUEST_TIMEOUT).items
        cfg = m.CiliumConfig.of(maps[0].data if maps else None)
        node_ips = []
        if cfg.host_network:
            nodes = [api.sanitize_for_serialization(n) for n in core.list_node(_request_timeout=REQUEST_TIMEOUT).items]
            node_ips = host_network_ips(nodes, cfg)
        want: dict[str, list[str]] = {}
        for gw in gateways:
            want.update(gateway_records(gw, cfg.host_network, node_ips))
        want = {h: a for h, a in want.items() if h.lower() == self.domain or h.lower().endswith("." + self.domain)}
        for host in sorted(set(self.published) - set(want)):
            self.records.clear_a(host)
            log.info("cluster %s: DNS (lab stand-in for the operator): cleared %s", self.cluster, host)
            del self.published[host]
        for host, addresses in want.items():
            if self.published.get(host) != addresses:
                self.records.set_a(host, addresses)
                self.published[host] = addresses
                log.info("cluster %s: DNS (lab stand-in for the operator): %s A %s", self.cluster, host,
                         ", ".join(addresses))

    def clear(self) -> None:
        for host in list(self.published):
            try:
                self.records.clear_a(host)
            except OSError:
                pass
            del self.published[host]
