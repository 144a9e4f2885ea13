"""How a zone's Gateway becomes reachable (zones[].ingress) and found (zones[].dns).

Pure builders (Cilium Helm values per mode, the LB-IPAM pool and L2 announcement policy, the
DNS records) and `expose`, which wires the zone's exposure: the pool and policy in
loadBalancer mode, the GatewayAddress wait, and the DNS record (RFC 2136) or the warning that
says which record to create (manual). Facts checked against github.com/cilium/cilium@v1.18.4:
values.yaml / values.schema.json (gatewayAPI.hostNetwork.*, envoy.securityContext.capabilities,
l2announcements.enabled, k8sClientRateLimit.{qps,burst} integers), the CRDs
ciliumloadbalancerippools.cilium.io (served and stored as v2) and
ciliuml2announcementpolicies.cilium.io (v2alpha1), and the operator's Gateway Service labels.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from kontinuum.dns.rfc2136 import record_lines
from kontinuum.stackconfig import model
from kontinuum.stackconfig.exposure import HOST_NETWORK, LOAD_BALANCER, RFC2136, Ingress
from providers.dns_record import DnsRecord
from providers.gateway_address import GatewayAddress

POOL_API = "cilium.io/v2"
L2_POLICY_API = "cilium.io/v2alpha1"
NAME = "kontinuum-gateway"  # the pool and the policy (cluster-scoped)
OWNING_GATEWAY_LABEL = "io.cilium.gateway/owning-gateway"  # on the Service Cilium creates for a Gateway
SERVICE_NAMESPACE_LABEL = "io.kubernetes.service.namespace"  # LB-IPAM's pseudo label
ENVOY_CAPABILITIES = ["NET_ADMIN", "SYS_ADMIN"]  # the chart's default envoy list, kept
# Cilium's docs: client QPS ≈ L2-announced services / leaseRenewDeadline (5 s), burst a bit
# higher; 20/40 leaves room for ~100 announced services (the chart's defaults are 10/20).
K8S_CLIENT_RATE_LIMIT = {"qps": 20, "burst": 40}


# -- pure builders --------------------------------------------------------------------------


def cilium_values(ingress: Ingress, extra: dict, agent_capabilities: list[str]) -> dict:
    """The Helm values that make the zone's Gateway reachable in the chosen mode (extra: the
    stack's own values, which say whether Envoy runs embedded in the agent)."""
    values: dict = {"gatewayAPI": {"gatewayClass": {"create": "true"}}}
    if ingress.mode == HOST_NETWORK:
        values["gatewayAPI"]["hostNetwork"] = {"enabled": True, "nodes": {"matchLabels": dict(ingress.node_selector)}}
        # Envoy binds 80 and 443 on the node: it keeps CAP_NET_BIND_SERVICE (cilium-envoy-starter
        # drops every other), added to whichever container runs it.
        values["envoy"] = {"securityContext": {"capabilities": {
            "keepCapNetBindService": True, "envoy": ENVOY_CAPABILITIES + ["NET_BIND_SERVICE"]}}}
        if (extra.get("envoy") or {}).get("enabled") is False:  # embedded Envoy: in the agent
            values["securityContext"] = {"capabilities": {"ciliumAgent": [*agent_capabilities, "NET_BIND_SERVICE"]}}
    elif ingress.addresses:
        values["l2announcements"] = {"enabled": True}
        values["k8sClientRateLimit"] = dict(K8S_CLIENT_RATE_LIMIT)
    return values


def gateway_service_selector(namespace: str, gateway: str) -> dict:
    """Selects only the Service Cilium creates for the zone's Gateway."""
    return {"matchLabels": {SERVICE_NAMESPACE_LABEL: namespace, OWNING_GATEWAY_LABEL: gateway}}


def pool_block(block: str) -> dict:
    if "/" in block:
        return {"cidr": block}
    first, _, last = block.partition("-")
    return {"start": first.strip(), "stop": (last or first).strip()}


def pool_manifest(ingress: Ingress, labels: dict, namespace: str, gateway: str) -> dict:
    return {"apiVersion": POOL_API, "kind": "CiliumLoadBalancerIPPool",
            "metadata": {"name": NAME, "labels": dict(labels)},
            "spec": {"blocks": [pool_block(b) for b in ingress.addresses],
                     "serviceSelector": gateway_service_selector(namespace, gateway)}}


def l2_policy_manifest(ingress: Ingress, labels: dict, namespace: str, gateway: str) -> dict:
    spec: dict = {"serviceSelector": gateway_service_selector(namespace, gateway), "loadBalancerIPs": True,
                  "externalIPs": False}
    if ingress.interfaces:
        spec["interfaces"] = list(ingress.interfaces)
    return {"apiVersion": L2_POLICY_API, "kind": "CiliumL2AnnouncementPolicy",
            "metadata": {"name": NAME, "labels": dict(labels)}, "spec": spec}


def gateway_addresses(ingress: Ingress) -> list[dict]:
    """Gateway spec.addresses: the fixed address, which Cilium passes to LB-IPAM."""
    return [{"type": "IPAddress", "value": ingress.address}] if ingress.mode == LOAD_BALANCER and ingress.address \
        else []


def manual_dns_warning(zone: str, setting: str, host: str, lines: list[str]) -> str:
    return (f"zone {zone}: {setting}.mode is manual: create this DNS record so that {host} reaches the Gateway "
            f"(ACME HTTP-01 needs it): {'; '.join(lines)} (or set {setting}.mode: rfc2136)")


# -- wiring ---------------------------------------------------------------------------------


class Exposure:
    """addresses: Output[list[str]] (the Gateway's reachable addresses); records: Output[list[str]]
    (the DNS records, zone-file form); waits: what the Certificate wait must come after.

    Both follow membership (DESIGN §11): in host-network mode the members' addresses are an input
    of the GatewayAddress wait, whose addresses feed the DNS record and the manual instructions."""

    def __init__(self, name: str, *, parent: pulumi.Resource, zone: model.Zone, host: str, dns_zone: str,
                 path: str, labels: dict, namespace: str, gateway_name: str, gateway: pulumi.Resource,
                 zone_kubeconfig: pulumi.Input[str], tsig_keys: dict,
                 on_zone, depends_on: list, member_addresses: pulumi.Input[list] | None = None):
        """member_addresses: the zone's current members' addresses (TalosCluster.member_addresses)."""
        ingress, dns = zone.ingress, zone.dns
        deps = []
        if ingress.mode == LOAD_BALANCER and ingress.addresses:
            for suffix, manifest in (("lb-pool", pool_manifest(ingress, labels, namespace, gateway_name)),
                                     ("l2-policy", l2_policy_manifest(ingress, labels, namespace, gateway_name))):
                deps.append(k8s.apiextensions.CustomResource(
                    f"{name}-{suffix}", api_version=manifest["apiVersion"], kind=manifest["kind"],
                    metadata=manifest["metadata"], spec=manifest["spec"], opts=on_zone(*depends_on)))
        wait = GatewayAddress(
            f"{name}-gateway-address", kubeconfig=zone_kubeconfig, namespace=namespace, name=gateway_name,
            mode=ingress.mode, setting=f"{path}.ingress", timeout=float(zone.timeouts["gateway"]),
            node_selector=ingress.node_selector, pool=bool(ingress.addresses), fixed=ingress.address,
            trigger=gateway.metadata.apply(lambda md: f"{(md or {}).get('uid')}/{(md or {}).get('generation')}"),
            members=member_addresses if ingress.mode == HOST_NETWORK else None,
            opts=pulumi.ResourceOptions(parent=parent, depends_on=[gateway, *deps]))
        self.addresses = wait.addresses
        self.records = wait.addresses.apply(lambda a: record_lines(host, list(a or []), dns.ttl))
        self.waits: list[pulumi.Resource] = [wait]
        if dns.mode == RFC2136:
            key = tsig_keys[dns.key_name.rstrip(".").lower()]
            record = DnsRecord(f"{name}-dns-record", server=dns.server, zone=dns_zone, host=host,
                               addresses=wait.addresses, ttl=dns.ttl, key_name=key.name,
                               key_algorithm=key.algorithm, key_secret=pulumi.Output.secret(key.secret),
                               opts=pulumi.ResourceOptions(parent=parent))
            self.waits.append(record)
        else:
            setting = f"{path}.dns"
            self.records.apply(lambda lines: pulumi.log.warn(manual_dns_warning(zone.zone, setting, host, lines),
                                                             resource=parent) if lines else None)
