"""The Gateway stand-in (Cilium 1.18.4's Gateway API + LB-IPAM + Envoy) against a real
kube-apiserver, with the upstream Cilium CRDs, over real sockets on 127.0.40.0/24."""

from __future__ import annotations

import http.client

import pytest
import yaml
from kubernetes import client, config as kconfig

from lab import crds as lab_crds
from lab.standins import cilium_crds
from lab.standins.gateway import GatewayStandin

T = 10
NS = "kontinuum-system"
PORT = 18080  # the Gateway's HTTP listener (unprivileged, so the test needs no root)
NODES = {"n1": "127.0.40.11", "n2": "127.0.40.12"}
HOST = "a.lab.kontinuum.test"


@pytest.fixture(scope="module")
def kubeconfig(tools_bin, tmp_path_factory):
    from lab.controlplane import ClusterPKI, ControlPlane, free_port

    cp = ControlPlane("gwstandin", tmp_path_factory.mktemp("apiserver"), ClusterPKI.generate(),
                      address="127.0.40.2", apiserver_port=free_port("127.0.40.2"),
                      etcd_ports=(free_port("127.0.40.2"), free_port("127.0.40.2"))).start()
    text = cp.admin_kubeconfig()
    api = kconfig.new_client_from_config_dict(yaml.safe_load(text))
    with api:
        lab_crds.apply(api, lab_crds.gateway_api() + lab_crds.cert_manager())
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NS}}, _request_timeout=T)
        for name, ip in NODES.items():
            core.create_node({"metadata": {"name": name, "labels": {"role": "edge"} if name == "n2" else {}},
                              "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                                         "conditions": [{"type": "Ready", "status": "True", "reason": "lab",
                                                         "message": "lab"}]}}, _request_timeout=T)
        custom = client.CustomObjectsApi(api)
        custom.create_cluster_custom_object("gateway.networking.k8s.io", "v1", "gatewayclasses", {
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "cilium"}, "spec": {"controllerName": "io.cilium/gateway-controller"}},
            _request_timeout=T)
        _objects(core, custom)
    yield text
    cp.stop()


def _objects(core, custom):
    """The zone's Gateway and route, and what cert-manager creates for one HTTP-01 challenge."""
    gw = "gateway.networking.k8s.io"
    custom.create_namespaced_custom_object(gw, "v1", NS, "gateways", {
        "apiVersion": f"{gw}/v1", "kind": "Gateway", "metadata": {"name": "kontinuum"},
        "spec": {"gatewayClassName": "cilium", "listeners": [
            {"name": "http", "protocol": "HTTP", "port": PORT, "allowedRoutes": {"namespaces": {"from": "All"}}},
            {"name": "https", "protocol": "HTTPS", "port": 18443, "hostname": HOST,
             "tls": {"certificateRefs": [{"name": "kontinuum-tls"}]}}]}}, _request_timeout=T)
    custom.create_namespaced_custom_object(gw, "v1", NS, "httproutes", {
        "apiVersion": f"{gw}/v1", "kind": "HTTPRoute", "metadata": {"name": "kontinuum"},
        "spec": {"parentRefs": [{"name": "kontinuum", "sectionName": "http"}], "hostnames": [HOST],
                 "rules": [{"backendRefs": [{"name": "kontinuum", "port": 8080}]}]}}, _request_timeout=T)
    core.create_namespaced_service(NS, {"metadata": {"name": "kontinuum"},
                                        "spec": {"ports": [{"port": 8080}]}}, _request_timeout=T)
    core.create_namespaced_service(NS, {"metadata": {"name": "cm-acme-http-solver-x",
                                                     "labels": {"acme.cert-manager.io/http01-solver": "true"}},
                                        "spec": {"ports": [{"port": 8089}]}}, _request_timeout=T)
    custom.create_namespaced_custom_object(gw, "v1", NS, "httproutes", {
        "apiVersion": f"{gw}/v1", "kind": "HTTPRoute", "metadata": {"name": "cm-acme-http-solver-x"},
        "spec": {"parentRefs": [{"name": "kontinuum", "sectionName": "http"}], "hostnames": [HOST],
                 "rules": [{"matches": [{"path": {"type": "Exact", "value": "/.well-known/acme-challenge/tok"}}],
                            "backendRefs": [{"name": "cm-acme-http-solver-x", "port": 8089}]}]}}, _request_timeout=T)
    custom.create_namespaced_custom_object("acme.cert-manager.io", "v1", NS, "challenges", {
        "apiVersion": "acme.cert-manager.io/v1", "kind": "Challenge", "metadata": {"name": "c1"},
        "spec": {"type": "HTTP-01", "token": "tok", "key": "tok.thumbprint", "dnsName": HOST, "url": "https://x/c",
                 "authorizationURL": "https://x/a", "issuerRef": {"name": "acme", "kind": "ClusterIssuer"},
                 "solver": {"http01": {"gatewayHTTPRoute": {}}}}}, _request_timeout=T)


@pytest.fixture(scope="module")
def standin(kubeconfig):
    s = GatewayStandin(kubeconfig, cluster="test", crds=cilium_crds.crds())
    yield s
    s.close()


@pytest.fixture
def api(kubeconfig):
    a = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))
    yield a
    a.close()


def _config(api, **data):
    core = client.CoreV1Api(api)
    body = {"metadata": {"name": "cilium-config"}, "data": {"enable-gateway-api": "true", **data}}
    try:
        core.replace_namespaced_config_map("cilium-config", "kube-system", body, _request_timeout=T)
    except client.ApiException as e:
        assert e.status == 404
        core.create_namespaced_config_map("kube-system", body, _request_timeout=T)


def _gateway(api) -> dict:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", NS, "gateways", "kontinuum", _request_timeout=T)


def _programmed(gw) -> dict:
    return next(c for c in gw["status"]["conditions"] if c["type"] == "Programmed")


def _get(address: str, path: str, host: str = HOST) -> tuple[int, str]:
    conn = http.client.HTTPConnection(address, PORT, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": host})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def _poll(standin, times=2):
    for _ in range(times):  # a second pass sees the Service status the first one wrote
        standin.poll()


def test_gateway_lifecycle_by_exposure_mode(standin, api):
    standin.poll()  # no cilium-config: no Cilium, nothing programs the Gateway
    assert "status" not in _gateway(api) or not _gateway(api)["status"].get("addresses")

    # Cilium's defaults: a LoadBalancer Service and no pool -> no address, nothing listens.
    _config(api)
    _poll(standin)
    gw = _gateway(api)
    assert gw["status"]["addresses"] == []
    assert _programmed(gw)["status"] == "False" and _programmed(gw)["reason"] == "AddressNotAssigned"
    svc = client.CoreV1Api(api).read_namespaced_service("cilium-gateway-kontinuum", NS, _request_timeout=T)
    assert svc.spec.type == "LoadBalancer"
    assert [(c.type, c.status, c.reason) for c in svc.status.conditions] == [
        ("cilium.io/IPAMRequestSatisfied", "False", "no_pool")]
    assert standin.data_plane.listening() == []
    versions = (svc.metadata.resource_version, _gateway(api)["metadata"]["resourceVersion"])
    standin.poll()  # converged: another pass writes nothing
    assert versions == (client.CoreV1Api(api).read_namespaced_service("cilium-gateway-kontinuum", NS,
                                                                      _request_timeout=T).metadata.resource_version,
                        _gateway(api)["metadata"]["resourceVersion"])
    custom = client.CustomObjectsApi(api)
    assert custom.list_cluster_custom_object("cilium.io", "v2", "ciliumloadbalancerippools", _request_timeout=T)

    # Host network on the nodes labelled role=edge: Envoy listens on n2 only; the 1.18.x
    # Gateway still has no status address (cilium/cilium#42786).
    _config(api, **{"gateway-api-hostnetwork-enabled": "true", "gateway-api-hostnetwork-nodelabelselector": "role=edge"})
    _poll(standin)
    assert client.CoreV1Api(api).read_namespaced_service("cilium-gateway-kontinuum", NS,
                                                         _request_timeout=T).spec.type == "ClusterIP"
    assert standin.data_plane.listening() == [(NODES["n2"], PORT)]
    assert _programmed(_gateway(api))["reason"] == "AddressNotAssigned"
    assert _get(NODES["n2"], "/.well-known/acme-challenge/tok") == (200, "tok.thumbprint")
    # Anything else on the zone host reaches the kontinuum-server route, whose pods are kwok-played;
    # another host has no route at all.
    assert _get(NODES["n2"], "/.well-known/acme-challenge/other")[0] == 503
    assert _get(NODES["n2"], "/.well-known/acme-challenge/tok", host="b.lab.kontinuum.test")[0] == 404

    # LB-IPAM: a pool gives the Service an address and the Gateway is Programmed; it is reachable
    # only once L2 announcements are on and a policy selects the Service.
    _config(api)
    custom.create_cluster_custom_object("cilium.io", "v2", "ciliumloadbalancerippools", {
        "apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool", "metadata": {"name": "zone"},
        "spec": {"blocks": [{"start": "127.0.40.100", "stop": "127.0.40.103"}],
                 "serviceSelector": {"matchLabels": {"io.kubernetes.service.namespace": NS}}}}, _request_timeout=T)
    _poll(standin)
    gw = _gateway(api)
    assert gw["status"]["addresses"] == [{"type": "IPAddress", "value": "127.0.40.100"}]
    assert _programmed(gw)["status"] == "True"
    assert standin.data_plane.listening() == []
    _config(api, **{"enable-l2-announcements": "true"})
    custom.create_cluster_custom_object("cilium.io", "v2alpha1", "ciliuml2announcementpolicies", {
        "apiVersion": "cilium.io/v2alpha1", "kind": "CiliumL2AnnouncementPolicy", "metadata": {"name": "zone"},
        "spec": {"loadBalancerIPs": True, "interfaces": ["^eth[0-9]+"]}}, _request_timeout=T)
    _poll(standin)
    assert standin.data_plane.listening() == [("127.0.40.100", PORT)]
    assert _get("127.0.40.100", "/.well-known/acme-challenge/tok") == (200, "tok.thumbprint")

    # A fixed address from the pool is honoured; one outside every pool leaves no address.
    patch = {"spec": {"addresses": [{"type": "IPAddress", "value": "127.0.40.102"}]}}
    custom.patch_namespaced_custom_object("gateway.networking.k8s.io", "v1", NS, "gateways", "kontinuum", patch,
                                          _request_timeout=T)
    _poll(standin, 3)
    assert _gateway(api)["status"]["addresses"] == [{"type": "IPAddress", "value": "127.0.40.102"}]
    assert standin.data_plane.listening() == [("127.0.40.102", PORT)]
    patch["spec"]["addresses"][0]["value"] = "127.0.40.150"
    custom.patch_namespaced_custom_object("gateway.networking.k8s.io", "v1", NS, "gateways", "kontinuum", patch,
                                          _request_timeout=T)
    _poll(standin, 3)
    gw = _gateway(api)
    assert gw["status"]["addresses"] == [] and _programmed(gw)["reason"] == "AddressNotAssigned"
    svc = client.CoreV1Api(api).read_namespaced_service("cilium-gateway-kontinuum", NS, _request_timeout=T)
    assert svc.status.conditions[0].reason == "no_pool" and "127.0.40.150" in svc.status.conditions[0].message
    assert standin.data_plane.listening() == []


def test_product_wait_reads_what_the_standin_assigns(standin, api, kubeconfig):
    """kontinuum.kube.gateways against this Cilium: node addresses in host-network mode (1.18.x
    reports none), pool addresses once Programmed, a clear failure naming the setting otherwise."""
    from kontinuum.kube.gateways import GatewayNoAddress, wait_addresses

    custom = client.CustomObjectsApi(api)
    custom.patch_namespaced_custom_object("gateway.networking.k8s.io", "v1", NS, "gateways", "kontinuum",
                                          {"spec": {"addresses": None}}, _request_timeout=T)
    _config(api, **{"gateway-api-hostnetwork-enabled": "true"})
    _poll(standin)
    assert wait_addresses(kubeconfig, NS, "kontinuum", mode="hostNetwork", setting="zones[0].ingress", timeout=5,
                          node_selector={}).addresses == sorted(NODES.values())
    with pytest.raises(GatewayNoAddress) as e:
        wait_addresses(kubeconfig, NS, "kontinuum", mode="hostNetwork", setting="zones[0].ingress", timeout=1,
                       node_selector={"role": "nothing"}, interval=0.5)
    assert "no Ready node matches {'role': 'nothing'}" in str(e.value) and "zones[0].ingress.nodeSelector" in str(e.value)

    custom.delete_cluster_custom_object("cilium.io", "v2", "ciliumloadbalancerippools", "zone", _request_timeout=T)
    _config(api)
    _poll(standin, 3)
    with pytest.raises(GatewayNoAddress) as e:
        wait_addresses(kubeconfig, NS, "kontinuum", mode="loadBalancer", setting="zones[1].ingress", timeout=1,
                       interval=0.5)
    message = str(e.value)
    assert "Gateway kontinuum-system/kontinuum has no address after 1 s" in message
    assert "Programmed=False (AddressNotAssigned: Gateway waiting for address)" in message
    assert "no_pool" in message and "set zones[1].ingress.addresses" in message and "mode: hostNetwork" in message


def test_the_wait_and_the_refresh_follow_membership(standin, api, kubeconfig):
    """Issue 27: in host-network mode only the members' Nodes serve. A machine that left drops out
    while its Node is still Ready; the wait lasts until a joined member's Node is Ready (woken by
    the Node watch), or publishes the members that came at its bound; a refresh looks once."""
    import threading
    import time

    from kontinuum.kube.gateways import observe_addresses, wait_addresses
    from providers.gateway_address import GatewayAddressProvider

    core = client.CoreV1Api(api)
    _config(api, **{"gateway-api-hostnetwork-enabled": "true"})
    _poll(standin)
    n1, n2, n3 = NODES["n1"], NODES["n2"], "127.0.40.13"
    wait = dict(mode="hostNetwork", setting="zones[0].ingress", node_selector={})
    assert wait_addresses(kubeconfig, NS, "kontinuum", timeout=5, members=[n1, n2], **wait).addresses == [n1, n2]

    # n2 is replaced by n3, whose Node registers a moment later; n2's Node is still Ready.
    later = threading.Timer(1.5, lambda: core.create_node({"metadata": {"name": "n3"}, "status": {
        "addresses": [{"type": "InternalIP", "address": n3}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "lab", "message": "lab"}]}}, _request_timeout=T))
    started = time.monotonic()
    later.start()
    try:
        reach = wait_addresses(kubeconfig, NS, "kontinuum", timeout=20, members=[n1, n3], interval=5, **wait)
    finally:
        later.join()
    took = time.monotonic() - started
    assert reach.addresses == [n1, n3] and reach.pending == {} and 1.5 <= took < 5, took  # the watch woke it
    one_look = dict(mode="hostNetwork", node_selector={}, members=[n1, n3])
    assert observe_addresses(kubeconfig, NS, "kontinuum", **one_look).addresses == [n1, n3]

    # A refresh records what it reads; the next up follows (the diff plans nothing new for the wait).
    p = GatewayAddressProvider()
    recorded = {"kubeconfig": kubeconfig, "namespace": NS, "name": "kontinuum", "setting": "zones[0].ingress",
                "timeout": 5, "nodeSelector": {}, "pool": False, "fixed": None, "trigger": "u/1", "mode": "hostNetwork",
                "members": [n1, n3], "addresses": [n1, n2], "pending": []}
    assert p.read("kontinuum-system/kontinuum", recorded).outs["addresses"] == [n1, n3]

    # A member whose Node never comes: at the bound the others are published, it is pending.
    core.delete_node("n3", _request_timeout=T)
    reach = wait_addresses(kubeconfig, NS, "kontinuum", timeout=1, members=[n1, n3], interval=0.5, **wait)
    assert reach.addresses == [n1] and reach.pending == {n3: "no Node has this address yet"}
    outs = p.update("kontinuum-system/kontinuum", recorded, {**recorded, "timeout": 1}).outs
    assert outs["addresses"] == [n1] and outs["pending"] == [n3] and p.diff("id", outs, recorded).changes

    # A cluster that does not answer: one bounded look, the record kept.
    silent = kubeconfig.replace(urlparse_server(kubeconfig), "https://127.0.40.2:1")
    started = time.monotonic()
    assert p.read("kontinuum-system/kontinuum", {**recorded, "kubeconfig": silent}).outs["addresses"] == [n1, n2]
    assert time.monotonic() - started < 10


def urlparse_server(kubeconfig: str) -> str:
    return yaml.safe_load(kubeconfig)["clusters"][0]["cluster"]["server"]
