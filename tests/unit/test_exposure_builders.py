"""What the exposure puts on a zone cluster and in the ClusterIssuer, built without Pulumi."""

import base64

from kontinuum.dns.rfc2136 import by_type, record_lines, split_server
from kontinuum.kube import gateways
from kontinuum.talos import pki
from kontinuum.stackconfig.exposure import Ingress
from kontinuum.stackconfig.model import Auth, Hub
from kontinuum_components import downstream as d, exposure

HUB = Hub("example.com", "hub.example.com:443", "ops@example.com", "https://acme.example/dir",
                 Auth("anonymous"))
LB = Ingress(mode="loadBalancer", addresses=("192.0.2.0/28", "192.0.2.40-192.0.2.45", "192.0.2.50"),
                    interfaces=("^eth0$",), address="192.0.2.41")


def test_pool_and_policy_select_only_the_zone_gateway_service():
    pool = exposure.pool_manifest(LB, {"k": "v"}, "kontinuum-system", "kontinuum")
    assert pool["apiVersion"] == "cilium.io/v2" and pool["metadata"] == {"name": "kontinuum-gateway", "labels": {"k": "v"}}
    assert pool["spec"]["blocks"] == [{"cidr": "192.0.2.0/28"}, {"start": "192.0.2.40", "stop": "192.0.2.45"},
                                      {"start": "192.0.2.50", "stop": "192.0.2.50"}]
    selector = {"matchLabels": {"io.kubernetes.service.namespace": "kontinuum-system",
                                "io.cilium.gateway/owning-gateway": "kontinuum"}}
    assert pool["spec"]["serviceSelector"] == selector
    policy = exposure.l2_policy_manifest(LB, {}, "kontinuum-system", "kontinuum")
    assert policy["apiVersion"] == "cilium.io/v2alpha1"
    assert policy["spec"] == {"serviceSelector": selector, "loadBalancerIPs": True, "externalIPs": False,
                              "interfaces": ["^eth0$"]}
    assert "interfaces" not in exposure.l2_policy_manifest(Ingress(mode="loadBalancer", addresses=("192.0.2.0/30",)),
                                                           {}, "ns", "gw")["spec"]


def test_gateway_carries_the_fixed_address_only_in_load_balancer_mode():
    assert d.gateway_spec("eu", "a", HUB, LB)["addresses"] == [{"type": "IPAddress", "value": "192.0.2.41"}]
    assert "addresses" not in d.gateway_spec("eu", "a", HUB, Ingress())
    assert "addresses" not in d.gateway_spec("eu", "a", HUB)


def test_cluster_issuer_trusts_the_private_acme_ca():
    assert "caBundle" not in d.cluster_issuer_spec(HUB)["acme"]
    pem = pki.new_ca(common_name="pebble").crt.decode()
    hub = Hub(**{**HUB.__dict__, "acme_ca_bundle": pem})
    assert base64.b64decode(d.cluster_issuer_spec(hub)["acme"]["caBundle"]).decode() == pem


def test_dns_record_text_and_server_forms():
    assert record_lines("a.eu.example.com", ["192.0.2.1", "2001:db8::1", "192.0.2.1"], 60) == [
        "a.eu.example.com. 60 IN A 192.0.2.1", "a.eu.example.com. 60 IN AAAA 2001:db8::1"]
    assert by_type(["2001:db8::1"]) == {"A": [], "AAAA": ["2001:db8::1"]}
    assert [split_server(s) for s in ("192.0.2.53", "ns1.example:5353", "[2001:db8::53]:54", "2001:db8::53")] == [
        ("192.0.2.53", 53), ("ns1.example", 5353), ("2001:db8::53", 54), ("2001:db8::53", 53)]
    warning = exposure.manual_dns_warning("a", "zones[0].dns", "a.eu.example.com", ["a.eu.example.com. 300 IN A 192.0.2.1"])
    assert "zones[0].dns.mode is manual" in warning and "IN A 192.0.2.1" in warning and "rfc2136" in warning


def test_gateway_reachability_rules():
    gw = {"metadata": {"generation": 2}, "status": {
        "conditions": [{"type": "Accepted", "status": "True", "observedGeneration": 2},
                       {"type": "Programmed", "status": "True", "observedGeneration": 1}],
        "addresses": [{"type": "IPAddress", "value": "192.0.2.41"}]}}
    assert gateways.programmed_addresses(gw) == []  # Programmed for an older generation: not yet
    gw["status"]["conditions"][1]["observedGeneration"] = 2
    assert gateways.programmed_addresses(gw) == ["192.0.2.41"] and gateways.accepted(gw)
    node = lambda ip, ready, **labels: {"metadata": {"labels": labels}, "status": {  # noqa: E731
        "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": "n"}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    nodes = [node("192.0.2.3", True, edge="true"), node("192.0.2.2", True), node("192.0.2.4", False, edge="true")]
    assert gateways.node_addresses(nodes, {}) == ["192.0.2.2", "192.0.2.3"]
    assert gateways.node_addresses(nodes, {"edge": "true"}) == ["192.0.2.3"]
    assert "no Gateway controller took it" in gateways.describe({"status": {}})
    assert "zones[2].ingress.addresses" in gateways.remedy("loadBalancer", "zones[2].ingress", pool=False, fixed=None,
                                                           selector={})
