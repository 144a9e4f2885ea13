"""The lab stand-ins against a real kube-apiserver playing both the zone cluster and the hub."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
import yaml
from cryptography import x509
from kubernetes import client, config as kconfig

from kontinuum.hub import crds as hub
from kontinuum.talos import pki
from lab import crds as lab_crds
from lab.process import wait_until
from lab.standins.cert_issuer import READY_MESSAGE, CertIssuer
from lab.standins.kontinuum_server import REJECTED_REASON, KontinuumServer
from lab.standins.loop import STANDIN_ANNOTATION

T = 10
NS = hub.ZONE_NAMESPACE  # the zone's namespace and the hub's coincide on this one apiserver


@pytest.fixture(scope="module")
def apiserver(tools_bin, tmp_path_factory):
    """Without controllers: the tests play the deployment controller (they mark Deployments
    Available), and a real one would undo that."""
    from lab.controlplane import ClusterPKI, ControlPlane, free_port

    cp = ControlPlane("standins", tmp_path_factory.mktemp("apiserver"), ClusterPKI.generate(),
                      apiserver_port=free_port(), etcd_ports=(free_port(), free_port())).start()
    yield cp
    cp.stop()


@pytest.fixture(scope="module")
def kubeconfig(apiserver) -> str:
    text = apiserver.admin_kubeconfig()
    api = kconfig.new_client_from_config_dict(yaml.safe_load(text))
    with api:
        lab_crds.apply(api, hub.manifests() + lab_crds.gateway_api() + lab_crds.cert_manager())
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NS}}, _request_timeout=T)
    return text


@pytest.fixture
def api(kubeconfig):
    a = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))
    yield a
    a.close()


# -- certificate issuer ---------------------------------------------------------------------


def _ready(custom, name) -> dict | None:
    cert = custom.get_namespaced_custom_object("cert-manager.io", "v1", NS, "certificates", name, _request_timeout=T)
    return next((c for c in cert.get("status", {}).get("conditions", []) if c["type"] == "Ready"), None)


def test_certificate_ready_only_after_cluster_issuer_and_gateway(api, kubeconfig):
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object("cert-manager.io", "v1", NS, "certificates", {
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": "kontinuum"},
        "spec": {"secretName": "kontinuum-tls", "dnsNames": ["eu-1a.eu.lab.test"],
                 "issuerRef": {"kind": "ClusterIssuer", "name": "acme", "group": "cert-manager.io"}},
    }, _request_timeout=T)
    issuer = CertIssuer(kubeconfig, interval=0.2)
    try:
        issuer.poll_once()
        ready = _ready(custom, "kontinuum")
        assert ready["status"] == "False" and "ClusterIssuer 'acme'" in ready["message"], ready

        custom.create_cluster_custom_object("cert-manager.io", "v1", "clusterissuers", {
            "apiVersion": "cert-manager.io/v1", "kind": "ClusterIssuer", "metadata": {"name": "acme"},
            "spec": {"acme": {"server": "https://acme.invalid/directory", "privateKeySecretRef": {"name": "acme"},
                              "solvers": [{"http01": {"gatewayHTTPRoute": {"parentRefs": [
                                  {"name": "kontinuum", "namespace": NS, "kind": "Gateway", "sectionName": "http"}]}}}]}},
        }, _request_timeout=T)
        issuer.poll_once()
        ready = _ready(custom, "kontinuum")
        assert ready["status"] == "False" and "Gateway" in ready["message"] and "ClusterIssuer" not in ready["message"]
        assert issuer.last_error is None

        custom.create_namespaced_custom_object("gateway.networking.k8s.io", "v1", NS, "gateways", {
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "kontinuum"},
            "spec": {"gatewayClassName": "cilium", "listeners": [
                {"name": "http", "protocol": "HTTP", "port": 80, "allowedRoutes": {"namespaces": {"from": "All"}}},
                {"name": "https", "protocol": "HTTPS", "port": 443, "hostname": "eu-1a.eu.lab.test",
                 "tls": {"mode": "Terminate", "certificateRefs": [{"kind": "Secret", "group": "", "name": "kontinuum-tls"}]}},
            ]},
        }, _request_timeout=T)
        issuer.start()
        wait_until("Certificate Ready", lambda: (_ready(custom, "kontinuum") or {}).get("status") == "True", 20)
    finally:
        issuer.stop()

    ready = _ready(custom, "kontinuum")
    assert (ready["reason"], ready["message"]) == ("Ready", READY_MESSAGE)
    cert = custom.get_namespaced_custom_object("cert-manager.io", "v1", NS, "certificates", "kontinuum", _request_timeout=T)
    assert "(lab stand-in)" in cert["metadata"]["annotations"][STANDIN_ANNOTATION]
    secret = client.CoreV1Api(api).read_namespaced_secret("kontinuum-tls", NS, _request_timeout=T)
    assert secret.type == "kubernetes.io/tls"
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret.data["tls.crt"]))
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert sans == ["eu-1a.eu.lab.test"]
    ci = custom.get_cluster_custom_object("cert-manager.io", "v1", "clusterissuers", "acme", _request_timeout=T)
    assert ci["status"]["conditions"][0]["status"] == "True"
    assert issuer.issued == [f"{NS}/kontinuum"]  # issued once, not on every poll


# -- kontinuum-server ---------------------------------------------------------------------


def _tls_secret(name: str, ident: pki.CertKey) -> dict:
    return {"metadata": {"name": name}, "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": ident.crt.decode(), "tls.key": pki.to_standard_pem(ident.key).decode()}}


def _kontinuum(custom, name):
    try:
        return custom.get_cluster_custom_object(hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, name, _request_timeout=T)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def _set_available(apps, status: str) -> None:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    apps.patch_namespaced_deployment_status(hub.ZONE_DEPLOYMENT, NS, {"status": {"conditions": [
        {"type": "Available", "status": status, "reason": "MinimumReplicasAvailable", "message": "test",
         "lastUpdateTime": now, "lastTransitionTime": now}]}}, _request_timeout=T)


def test_kontinuum_server_heartbeats_only_with_the_matching_identity(api, kubeconfig):
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    region, zone = "eu", "eu-1a"
    name = hub.zone_object_name(region, zone)
    ident, wrong = pki.new_ca(common_name=name, key_type="ed25519"), pki.new_ca(common_name=name, key_type="ed25519")
    server = KontinuumServer(region, zone, kubeconfig, kubeconfig, interval=0.2, heartbeat_interval=0.5)
    try:
        server.poll_once()
        assert server.state.phase == "waiting" and "does not exist" in server.state.message

        apps.create_namespaced_deployment(NS, {
            "metadata": {"name": hub.ZONE_DEPLOYMENT},
            "spec": {"selector": {"matchLabels": {"app": "kontinuum"}}, "template": {
                "metadata": {"labels": {"app": "kontinuum"}},
                "spec": {"containers": [{"name": "kontinuum", "image": "kontinuum:lab"}]}}},
        }, _request_timeout=T)
        core.create_namespaced_config_map(NS, {"metadata": {"name": hub.ZONE_ENV}, "data": {
            hub.ENV_REGION: region, hub.ENV_ZONE: zone, hub.ENV_ENDPOINT: "eu-1a.eu.lab.test"}}, _request_timeout=T)
        core.create_namespaced_secret(NS, _tls_secret(hub.ZONE_IDENTITY_SECRET, wrong), _request_timeout=T)
        core.create_namespaced_secret(hub.HUB_NAMESPACE, {"metadata": {"name": hub.hub_identity_secret_name(region, zone)},
                                                          "stringData": {hub.HUB_IDENTITY_CERT_KEY: ident.crt.decode()}},
                                      _request_timeout=T)
        server.poll_once()
        assert server.state.phase == "waiting" and "not Available" in server.state.message

        _set_available(apps, "True")
        server.poll_once()
        server.poll_once()
        expected = (f"identity key in {NS}/{hub.ZONE_IDENTITY_SECRET} does not match "
                    f"the hub's certificate {hub.hub_identity_secret_name(region, zone)}")
        assert server.state.phase == "rejected" and server.state.message == expected
        assert _kontinuum(custom, name) is None
        events = [e for e in core.list_namespaced_event(NS, _request_timeout=T).items if e.reason == REJECTED_REASON]
        assert len(events) == 1 and expected in events[0].message  # recorded once, not per poll
        assert events[0].involved_object.name == hub.ZONE_DEPLOYMENT

        core.replace_namespaced_secret(hub.ZONE_IDENTITY_SECRET, NS, _tls_secret(hub.ZONE_IDENTITY_SECRET, ident),
                                       _request_timeout=T)
        server.start()
        wait_until("a heartbeat", lambda: (_kontinuum(custom, name) or {}).get("status", {}).get("heartbeat"), 20)
        k = _kontinuum(custom, name)
        assert k["spec"] == {"region": region, "zone": zone, "endpoint": "eu-1a.eu.lab.test"}
        assert k["metadata"]["labels"] == {hub.LABEL_REGION: region, hub.LABEL_ZONE: zone}
        first = k["status"]["heartbeat"]
        wait_until("the heartbeat to advance", lambda: _kontinuum(custom, name)["status"]["heartbeat"] != first, 20)
        assert server.state.phase == "heartbeating" and server.last_error is None

        core.replace_namespaced_secret(hub.ZONE_IDENTITY_SECRET, NS, _tls_secret(hub.ZONE_IDENTITY_SECRET, wrong),
                                       _request_timeout=T)
        wait_until("rejection of the swapped key", lambda: server.state.phase == "rejected", 60)
    finally:
        server.stop()
    assert not server.running()
    stale = _kontinuum(custom, name)["status"]["heartbeat"]
    server2 = KontinuumServer(region, zone, kubeconfig, kubeconfig, heartbeat_interval=0)
    server2.poll_once()
    server2.close()
    assert server2.state.phase == "rejected"
    assert _kontinuum(custom, name)["status"]["heartbeat"] == stale


# -- the revision gate of the lab's object-driven passes -------------------------------------


def test_revision_gate_moves_on_a_write_and_after_its_stale_bound(api):
    from lab.standins.loop import RevisionGate

    now = [0.0]
    gate = RevisionGate(stale=5.0, clock=lambda: now[0])
    assert gate.moved(api)  # the first pass always runs
    assert not gate.moved(api)  # nothing was written
    client.CoreV1Api(api).create_namespaced_config_map(NS, {"metadata": {"generateName": "gate-"}}, _request_timeout=T)
    assert gate.moved(api)
    assert not gate.moved(api)
    now[0] = 5.0
    assert gate.moved(api)  # a pass at least every `stale` seconds, written to or not
    broken = client.ApiClient(client.Configuration(host="https://127.0.0.1:1"))
    assert gate.moved(broken)  # no answer: the pass runs and reports
