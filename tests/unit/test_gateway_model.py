"""The Gateway stand-in's decisions (Cilium 1.18.4's LB-IPAM, selectors, Gateway status, routing)."""

from lab.standins import gateway_model as m


def _svc(name="cilium-gateway-kontinuum", ns="kontinuum-system", labels=None, annotations=None, ingress=None):
    return {"metadata": {"name": name, "namespace": ns, "labels": labels or {}, "annotations": annotations or {}},
            "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": i} for i in ingress or []]}}}


def _pool(name, *blocks, selector=None, **spec):
    return {"metadata": {"name": name}, "spec": {"blocks": list(blocks), "serviceSelector": selector, **spec}}


def test_cilium_config_reads_the_upstream_chart_keys():
    cfg = m.CiliumConfig.of({"enable-gateway-api": "true", "gateway-api-hostnetwork-enabled": "true",
                             "gateway-api-hostnetwork-nodelabelselector": "role=edge,zone=a",
                             "enable-l2-announcements": "true"})
    assert cfg == m.CiliumConfig(True, True, {"role": "edge", "zone": "a"}, True)
    assert m.CiliumConfig.of({"enable-gateway-api": "true"}).host_network_nodes == {}


def test_selectors():
    assert m.selector_matches(None, {})
    assert m.selector_matches({"matchLabels": {}}, {"a": "b"})
    sel = {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "In", "values": ["x"]},
                                                          {"key": "c", "operator": "DoesNotExist"}]}
    assert m.selector_matches(sel, {"a": "1", "b": "x"})
    assert not m.selector_matches(sel, {"a": "1", "b": "y"})
    assert not m.selector_matches(sel, {"a": "1", "b": "x", "c": ""})


def test_lbipam_first_free_address_of_a_matching_pool():
    pools = [_pool("p", {"cidr": "192.0.2.0/30"}, allowFirstLastIPs="No")]
    assert m.allocate(_svc(), pools, set()).ips == ("192.0.2.1",)
    assert m.allocate(_svc(), pools, {"192.0.2.1"}).ips == ("192.0.2.2",)
    full = m.allocate(_svc(), pools, {"192.0.2.1", "192.0.2.2"})
    assert not full.satisfied and full.reason == "out_of_ips"


def test_lbipam_pool_selector_and_pseudo_labels():
    pools = [_pool("p", {"start": "192.0.2.10", "stop": "192.0.2.11"},
                   selector={"matchLabels": {m.NS_LABEL: "other"}})]
    a = m.allocate(_svc(), pools, set())
    assert (a.satisfied, a.reason, a.ips) == (False, "no_pool", ())
    pools[0]["spec"]["serviceSelector"] = {"matchLabels": {m.NS_LABEL: "kontinuum-system"}}
    assert m.allocate(_svc(), pools, set()).ips == ("192.0.2.10",)


def test_lbipam_honours_a_requested_address_only_inside_a_selecting_pool():
    pools = [_pool("p", {"cidr": "192.0.2.0/29"})]
    want = _svc(annotations={"io.cilium/lb-ipam-ips": "192.0.2.5"})
    assert m.allocate(want, pools, set()).ips == ("192.0.2.5",)
    taken = m.allocate(want, pools, {"192.0.2.5"})
    assert taken.reason == "already_allocated"
    outside = m.allocate(_svc(annotations={"lbipam.cilium.io/ips": "198.51.100.1"}), pools, set())
    assert (outside.satisfied, outside.reason) == (False, "no_pool")
    pools[0]["spec"]["serviceSelector"] = {"matchLabels": {"x": "y"}}
    assert m.allocate(want, pools, set()).reason == "pool_selector_mismatch"


def test_lbipam_keeps_a_valid_assignment_and_disabled_pools_give_nothing_new():
    pools = [_pool("p", {"cidr": "192.0.2.0/29"}, disabled=True)]
    assert m.allocate(_svc(ingress=["192.0.2.6"]), pools, set()).ips == ("192.0.2.6",)
    assert m.allocate(_svc(), pools, set()).reason == "out_of_ips"


def test_gateway_service_and_status_follow_cilium():
    gw = {"metadata": {"name": "kontinuum", "namespace": "ns", "uid": "u"},
          "spec": {"addresses": [{"type": "IPAddress", "value": "192.0.2.5"}],
                   "listeners": [{"name": "http", "port": 80}, {"name": "https", "port": 443}]}}
    host = m.desired_service(gw, m.CiliumConfig(True, True, {}))
    assert host["spec"]["type"] == "ClusterIP" and [p["port"] for p in host["spec"]["ports"]] == [80, 443]
    lb = m.desired_service(gw, m.CiliumConfig(True))
    assert lb["spec"]["type"] == "LoadBalancer"
    assert lb["metadata"]["annotations"] == {"io.cilium/lb-ipam-ips": "192.0.2.5"}
    assert m.programmed(gw, None)[:2] == (False, "AddressNotAssigned")
    assert m.programmed(gw, _svc(ingress=["192.0.2.6"]))[:2] == (False, "AddressNotUsable")
    ok = m.programmed(gw, _svc(ingress=["192.0.2.5"]))
    assert ok[0] and ok[3] == [{"type": "IPAddress", "value": "192.0.2.5"}]


def test_routing_precedence_hosts_and_attachment():
    gw = {"metadata": {"name": "g", "namespace": "ns"},
          "spec": {"listeners": [{"name": "http", "protocol": "HTTP", "port": 80,
                                  "allowedRoutes": {"namespaces": {"from": "Same"}}}]}}
    routes = m.routes_of(gw, [
        {"metadata": {"namespace": "ns"}, "spec": {"parentRefs": [{"name": "g"}], "hostnames": ["a.example"],
                                                   "rules": [{"backendRefs": [{"name": "app", "port": 8080}]}]}},
        {"metadata": {"namespace": "ns"}, "spec": {"parentRefs": [{"name": "g", "sectionName": "http"}],
                                                   "rules": [{"matches": [{"path": {"type": "Exact",
                                                                                    "value": "/x/y"}}],
                                                              "backendRefs": [{"name": "solver", "port": 1}]}]}},
        {"metadata": {"namespace": "elsewhere"}, "spec": {"parentRefs": [{"name": "g", "namespace": "ns"}],
                                                          "rules": [{"backendRefs": [{"name": "x", "port": 1}]}]}},
        {"metadata": {"namespace": "ns"}, "spec": {"parentRefs": [{"name": "g", "sectionName": "https"}],
                                                   "rules": [{"backendRefs": [{"name": "y", "port": 1}]}]}},
    ])
    assert m.match(routes, 80, "a.example:80", "/x/y").backend == ("ns", "solver", 1)
    assert m.match(routes, 80, "a.example", "/x").backend == ("ns", "app", 8080)
    assert m.match(routes, 80, "b.example", "/x") is None  # "Same" keeps the other namespace's route out
    assert m.match(routes, 81, "a.example", "/") is None
