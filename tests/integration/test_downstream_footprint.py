"""Downstream footprint: the pure manifest builders, the component's wiring (Pulumi mocks, in a
subprocess so its global runtime settings stay there), and CertificateReady against a real
kube-apiserver with the lab cert-manager and Gateway API CRDs — alone (Ready only on the
condition, bounded otherwise) and with the lab certificate-issuer stand-in fed the footprint's
own ClusterIssuer, Gateway and Certificate.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum.hub import crds as hub_crds
from kontinuum.stackconfig.model import Auth, Hub
from kontinuum_components import downstream as d
from lab import crds as lab_crds
from lab.standins.cert_issuer import CertIssuer, blocker, gateway_serves_secret
from kontinuum.kube.certificates import CertificateNotReady, describe_conditions, is_ready, wait_ready
from providers.certificate_ready import CertificateReadyProvider

ROOT = Path(__file__).resolve().parents[2]
T = 10
R, Z = "eu", "eu-1a"
HUB = Hub("lab.test", "hub.lab.test:8443", "ops@lab.test", "https://acme.lab.test/directory",
                 Auth("anonymous"))
HUB_OIDC = Hub("lab.test", "hub.lab.test:8443", "ops@lab.test", "https://acme.lab.test/directory",
                      Auth("oidc", "https://id.lab.test/realms/k", "kontinuum"))


# -- pure builders ----------------------------------------------------------------------------


def test_host_url_and_storage_dsn():
    assert d.zone_host(R, Z, HUB) == "eu-1a.eu.lab.test"
    assert d.zone_url(R, Z, HUB) == "https://eu-1a.eu.lab.test"
    assert d.storage_dsn("hub.lab.test:8443") == "grpc://zone@hub.lab.test:8443"


def test_env_config_anonymous():
    secret, cm = d.env_config(R, Z, HUB)
    assert secret == {"KONTINUUM_SERVER_STORAGE": "grpc://zone@hub.lab.test:8443"}
    assert cm == {
        hub_crds.ENV_REGION: "eu", hub_crds.ENV_ZONE: "eu-1a", hub_crds.ENV_ENDPOINT: "https://eu-1a.eu.lab.test",
        "KONTINUUM_SERVER_DNS_DOMAIN": "lab.test", "KONTINUUM_INSECURE_ALLOW_ANONYMOUS": "true",
    }


def test_env_config_oidc_mirrors_the_hub_and_drops_anonymous():
    secret, cm = d.env_config(R, Z, HUB_OIDC)
    assert secret == {"KONTINUUM_SERVER_STORAGE": "grpc://zone@hub.lab.test:8443"}
    assert cm["KONTINUUM_OIDC_ISSUER_URL"] == "https://id.lab.test/realms/k"
    assert cm["KONTINUUM_OIDC_CLIENT_ID"] == "kontinuum"
    assert "KONTINUUM_INSECURE_ALLOW_ANONYMOUS" not in cm
    assert not set(secret) & set(cm)  # envFrom both: no key may be set twice


def test_env_config_refuses_a_hub_without_auth():
    with pytest.raises(ValueError, match="refuses to start"):
        d.env_config(R, Z, Hub("lab.test", "h:1", "a@b", "https://acme", None))


def test_identity_secrets_split_private_and_public_halves():
    zone_side = d.identity_secret_manifest(R, Z, "CERT", "KEY")
    assert zone_side["type"] == "kubernetes.io/tls"
    assert zone_side["metadata"]["namespace"] == hub_crds.ZONE_NAMESPACE
    assert zone_side["metadata"]["name"] == hub_crds.ZONE_IDENTITY_SECRET
    assert zone_side["stringData"] == {"tls.crt": "CERT", "tls.key": "KEY"}
    hub_side = d.hub_identity_secret_manifest(R, Z, "CERT", "ab12")
    assert hub_side["type"] == "Opaque"
    assert hub_side["metadata"]["namespace"] == hub_crds.HUB_NAMESPACE
    assert hub_side["metadata"]["name"] == hub_crds.hub_identity_secret_name(R, Z) == "eu-eu-1a-identity"
    assert hub_side["stringData"] == {hub_crds.HUB_IDENTITY_CERT_KEY: "CERT"}  # never the key
    assert hub_side["metadata"]["annotations"] == {d.THUMBPRINT_ANNOTATION: "ab12"}


def test_deployment_and_service():
    dep = d.deployment_manifest(R, Z, "registry.lab/kontinuum:1", "h1")
    assert (dep["metadata"]["namespace"], dep["metadata"]["name"]) == (hub_crds.ZONE_NAMESPACE, hub_crds.ZONE_DEPLOYMENT)
    pod = dep["spec"]["template"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["metadata"]["annotations"] == {d.CONFIG_HASH_ANNOTATION: "h1"}
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "registry.lab/kontinuum:1"
    assert c["envFrom"] == [{"secretRef": {"name": hub_crds.ZONE_ENV}}, {"configMapRef": {"name": hub_crds.ZONE_ENV}}]
    assert {(p["name"], p["containerPort"]) for p in c["ports"]} == {("http", 8080), ("grpc", 9090)}
    (vol,) = pod["spec"]["volumes"]
    assert vol["secret"]["secretName"] == hub_crds.ZONE_IDENTITY_SECRET
    assert c["volumeMounts"] == [{"name": vol["name"], "mountPath": d.IDENTITY_MOUNT, "readOnly": True}]
    assert "tolerations" not in pod["spec"] and "nodeSelector" not in pod["spec"]
    svc = d.service_manifest(R, Z)
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert {(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {("http", 8080, "http"),
                                                                                     ("grpc", 9090, "grpc")}


def test_config_hash_follows_env_image_and_identity():
    s, cm = d.env_config(R, Z, HUB)
    base = d.config_hash(s, cm, "img:1", "tp1")
    assert base == d.config_hash(dict(s), dict(cm), "img:1", "tp1")
    others = {d.config_hash(s, cm, "img:2", "tp1"), d.config_hash(s, cm, "img:1", "tp2"),
              d.config_hash(*d.env_config(R, Z, HUB_OIDC), "img:1", "tp1")}
    assert base not in others and len(others) == 3


def test_cluster_issuer_acme_http01_through_the_gateway_http_listener():
    spec = d.cluster_issuer_spec(HUB)
    assert spec == {"acme": {
        "server": "https://acme.lab.test/directory", "email": "ops@lab.test",
        "privateKeySecretRef": {"name": d.ACME_ACCOUNT_SECRET},
        "solvers": [{"http01": {"gatewayHTTPRoute": {"parentRefs": [
            {"name": d.GATEWAY, "namespace": hub_crds.ZONE_NAMESPACE, "kind": "Gateway", "sectionName": "http"}]}}}],
    }}
    m = d.cluster_issuer_manifest(R, Z, HUB)
    assert m["kind"] == "ClusterIssuer" and "namespace" not in m["metadata"]
    listeners = {ls["name"]: ls for ls in d.gateway_spec(R, Z, HUB)["listeners"]}
    assert "http" in listeners  # the sectionName the solver attaches to exists


def test_gateway_listeners():
    spec = d.gateway_spec(R, Z, HUB)
    assert spec["gatewayClassName"] == "cilium"
    http, https = spec["listeners"]
    assert http == {"name": "http", "protocol": "HTTP", "port": 80, "allowedRoutes": {"namespaces": {"from": "All"}}}
    assert "hostname" not in http
    assert (https["name"], https["protocol"], https["port"], https["hostname"]) == ("https", "HTTPS", 443,
                                                                                  "eu-1a.eu.lab.test")
    assert https["tls"] == {"mode": "Terminate",
                            "certificateRefs": [{"kind": "Secret", "group": "", "name": d.TLS_SECRET}]}


def test_certificate_and_httproute_point_at_each_other():
    cert = d.certificate_manifest(R, Z, HUB)
    gw = d.gateway_manifest(R, Z, HUB)
    assert cert["spec"]["dnsNames"] == ["eu-1a.eu.lab.test"]
    assert cert["spec"]["issuerRef"] == {"name": d.CLUSTER_ISSUER, "kind": "ClusterIssuer", "group": "cert-manager.io"}
    # what the lab issuer stand-in demands: the Gateway serves the Certificate's secret
    assert gateway_serves_secret(gw, hub_crds.ZONE_NAMESPACE, cert["spec"]["secretName"])
    assert blocker(cert, {d.CLUSTER_ISSUER}, set(), [gw]) is None
    route = d.httproute_spec(R, Z, HUB)
    assert route["parentRefs"] == [{"name": d.GATEWAY, "namespace": hub_crds.ZONE_NAMESPACE, "sectionName": "https"}]
    assert route["hostnames"] == ["eu-1a.eu.lab.test"]
    (rule,) = route["rules"]
    assert rule["backendRefs"] == [{"name": d.SERVICE, "port": d.HTTP_PORT}]
    svc_ports = {p["port"] for p in d.service_manifest(R, Z)["spec"]["ports"]}
    assert d.HTTP_PORT in svc_ports


def test_every_zone_object_carries_region_and_zone_labels():
    for m in (d.namespace_manifest(R, Z), d.env_secret_manifest(R, Z, {}), d.env_configmap_manifest(R, Z, {}),
              d.deployment_manifest(R, Z, "i"), d.service_manifest(R, Z), d.cluster_issuer_manifest(R, Z, HUB),
              d.gateway_manifest(R, Z, HUB), d.certificate_manifest(R, Z, HUB), d.httproute_manifest(R, Z, HUB)):
        assert m["metadata"]["labels"][hub_crds.LABEL_REGION] == R, m["kind"]
        assert m["metadata"]["labels"][hub_crds.LABEL_ZONE] == Z, m["kind"]
        assert m["kind"] == "Namespace" or m["kind"] == "ClusterIssuer" or \
            m["metadata"]["namespace"] == hub_crds.ZONE_NAMESPACE


# -- component wiring under Pulumi mocks ------------------------------------------------------------

_MOCK_PROGRAM = textwrap.dedent('''
    import json
    import pulumi

    records, deps = [], {}

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            outs = dict(args.inputs)
            if args.typ == "pulumi-python:dynamic/hub:ZoneIdentity" and args.name.endswith("-zone-identity"):
                from providers.zone_identity import ZoneIdentityProvider
                outs.update(ZoneIdentityProvider().create({"region": "eu", "zone": "eu-1a"}).outs)
            if args.name.endswith("-certificate-ready"):
                outs["ready"] = True
            if isinstance(outs.get("metadata"), dict):
                outs["metadata"] = {**outs["metadata"], "uid": "uid-" + args.name, "generation": 1}
            records.append({"type": args.typ, "name": args.name, "provider": args.provider or "",
                            "inputs": args.inputs})
            return [args.name + "-id", outs]

        def call(self, args):
            return {}

    pulumi.runtime.set_mocks(Mocks(), project="kontinuum", stack="test", preview=False)

    def record_deps(args):
        opts = args.opts.depends_on if args.opts else None
        opts = opts if isinstance(opts, list) else ([opts] if opts else [])
        deps[args.name] = [getattr(x, "_name", None) for x in opts]

    pulumi.runtime.register_stack_transformation(record_deps)

    import pulumi_kubernetes as k8s
    from kontinuum.stackconfig.parse import parse
    from kontinuum_components.downstream import DownstreamFootprint
    from providers.zone_identity import ZoneIdentity

    stack = parse({"region": "eu", "hub": {"dnsDomain": "lab.test", "grpcEndpoint": "hub.lab.test:8443",
                          "acme": {"email": "ops@lab.test"}, "auth": {"mode": "anonymous"}},
                          "zones": [{"zone": "eu-1a", "talosAddresses": ["127.0.0.10"], "serverImage": "k:1",
                                     "timeouts": {"certificate": 42}}]})
    zp = k8s.Provider("zone", kubeconfig="zone")
    hp = k8s.Provider("hub", kubeconfig="hub")
    gate = k8s.core.v1.ConfigMap("addons-ready", metadata={"name": "x", "namespace": "y"}, opts=pulumi.ResourceOptions(provider=zp))
    ident = ZoneIdentity("eu-eu-1a-zone-identity", region="eu", zone="eu-1a")
    fp = DownstreamFootprint("eu-eu-1a", region="eu", zone=stack.zones[0], hub=stack.hub, zone_provider=zp,
                             hub_provider=hp, zone_kubeconfig=pulumi.Output.secret("zone-kubeconfig"),
                             identity=ident, depends_on=[gate])

    @pulumi.runtime.test
    def run():
        return pulumi.Output.all(fp.url, fp.installed, fp.revision, ident.thumbprint, ident.certificatePem).apply(
            lambda a: print("RESULT " + json.dumps({"outputs": a, "records": records, "deps": deps}, default=str)))

    run()
''')


@pytest.fixture(scope="module")
def mocked(tmp_path_factory) -> dict:
    prog = tmp_path_factory.mktemp("mock") / "program.py"
    prog.write_text(_MOCK_PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"mock program failed:\n{out.stdout}\n{out.stderr}"
    return json.loads(line[len("RESULT "):])


def _unsecret(v):
    """Mocks see secrets as {sig: ..., value: ...}; unwrap for assertions."""
    if isinstance(v, dict):
        if "4dabf18193072939515e22adb298388d" in v:
            return _unsecret(v["value"])
        return {k: _unsecret(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_unsecret(x) for x in v]
    return v


def _by_name(mocked) -> dict:
    return {r["name"]: r for r in mocked["records"]}


def test_component_outputs(mocked):
    url, installed, revision, _thumb, _cert = mocked["outputs"]
    assert url == "https://eu-1a.eu.lab.test" and installed is True and len(revision) == 64


def test_component_dependency_order(mocked):
    deps = mocked["deps"]
    n = "eu-eu-1a"
    assert deps[f"{n}-namespace"] == ["addons-ready"]
    for s in ("env-secret", "env-configmap", "identity-secret"):
        assert deps[f"{n}-{s}"] == [f"{n}-namespace"]
    assert sorted(deps[f"{n}-deployment"]) == sorted(f"{n}-{s}" for s in ("env-secret", "env-configmap",
                                                                          "identity-secret", "hub-identity"))
    chain = ["deployment", "service", "cluster-issuer", "gateway", "certificate", "certificate-ready"]
    for before, after in zip(chain, chain[1:]):
        assert f"{n}-{before}" in deps[f"{n}-{after}"], (before, after)
    # The route exists before the readiness wait (seeds), right after the Gateway it attaches to.
    assert deps[f"{n}-httproute"] == [f"{n}-gateway"] and f"{n}-httproute" in deps[f"{n}-certificate-ready"]


def test_component_providers_and_secrets(mocked):
    res = _by_name(mocked)
    n = "eu-eu-1a"
    hub_secret = res[f"{n}-hub-identity"]
    assert hub_secret["provider"].split("::")[-2:] == ["hub", "hub-id"]
    for suffix in ("namespace", "env-secret", "env-configmap", "identity-secret", "deployment", "service",
                   "cluster-issuer", "gateway", "certificate", "httproute"):
        assert res[f"{n}-{suffix}"]["provider"].split("::")[-2:] == ["zone", "zone-id"], suffix
    _url, _inst, _rev, thumbprint, cert_pem = mocked["outputs"]
    hub_inputs = _unsecret(hub_secret["inputs"])
    assert hub_inputs["stringData"] == {hub_crds.HUB_IDENTITY_CERT_KEY: cert_pem}
    assert hub_inputs["metadata"]["annotations"][d.THUMBPRINT_ANNOTATION] == thumbprint
    # private material and the kubeconfig only ever travel as secrets
    ident = res[f"{n}-identity-secret"]["inputs"]
    assert "4dabf18193072939515e22adb298388d" in ident["stringData"]
    assert _unsecret(ident["stringData"])["tls.key"].startswith("-----BEGIN PRIVATE KEY-----")
    assert "4dabf18193072939515e22adb298388d" in res[f"{n}-env-secret"]["inputs"]["stringData"]
    wait = res[f"{n}-certificate-ready"]["inputs"]
    assert "4dabf18193072939515e22adb298388d" in wait["kubeconfig"]
    assert (wait["namespace"], wait["name"], wait["timeout"]) == (hub_crds.ZONE_NAMESPACE, d.CERTIFICATE, 42)
    assert wait["trigger"] == f"uid-{n}-certificate/1"
    dep = _unsecret(res[f"{n}-deployment"]["inputs"])
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "k:1"
    assert dep["spec"]["template"]["metadata"]["annotations"][d.CONFIG_HASH_ANNOTATION] == mocked["outputs"][2]


# -- CertificateReady against a real apiserver ----------------------------------------------------

NS = hub_crds.ZONE_NAMESPACE


@pytest.fixture(scope="module")
def kubeconfig(apiserver) -> str:
    text = apiserver.admin_kubeconfig()
    api = kconfig.new_client_from_config_dict(yaml.safe_load(text))
    with api:
        lab_crds.apply(api, lab_crds.gateway_api() + lab_crds.cert_manager())
        client.CoreV1Api(api).create_namespace(d.namespace_manifest(R, Z), _request_timeout=T)
    return text


@pytest.fixture
def custom(kubeconfig):
    api = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))
    yield client.CustomObjectsApi(api)
    api.close()


def _cert(custom, name: str, issuer: str = "acme") -> dict:
    return custom.create_namespaced_custom_object("cert-manager.io", "v1", NS, "certificates", {
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate", "metadata": {"name": name},
        "spec": {"secretName": f"{name}-tls", "dnsNames": [f"{name}.lab.test"],
                 "issuerRef": {"kind": "ClusterIssuer", "name": issuer, "group": "cert-manager.io"}},
    }, _request_timeout=T)


def _set_ready(custom, name: str, status: str, reason: str, message: str, observed: int | None = None) -> None:
    cond = {"type": "Ready", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}
    if observed is not None:
        cond["observedGeneration"] = observed
    custom.patch_namespaced_custom_object_status("cert-manager.io", "v1", NS, "certificates", name,
                                                 {"status": {"conditions": [cond]}}, _request_timeout=T)


def _props(kubeconfig, name, timeout):
    return {"kubeconfig": kubeconfig, "namespace": NS, "name": name, "timeout": timeout,
            "gateway": f"{NS}/{d.GATEWAY}"}


def test_pure_readiness_rules():
    base = {"metadata": {"generation": 2}}
    ready = {"type": "Ready", "status": "True", "reason": "Ready", "message": "ok"}
    assert not is_ready(base)
    assert is_ready({**base, "status": {"conditions": [ready]}})
    assert is_ready({**base, "status": {"conditions": [dict(ready, observedGeneration=2)]}})
    assert not is_ready({**base, "status": {"conditions": [dict(ready, observedGeneration=1)]}})
    assert not is_ready({**base, "status": {"conditions": [dict(ready, status="False")]}})
    text = describe_conditions({**base, "status": {"conditions": [dict(ready, observedGeneration=1)]}})
    assert text == "Ready=True (Ready: ok) [for generation 1, Certificate is at 2]"
    assert "no conditions yet" in describe_conditions(base)
    p = CertificateReadyProvider()
    assert sorted(f.property for f in p.check({}, {"timeout": "x"}).failures) == ["kubeconfig", "name", "namespace",
                                                                                "timeout"]
    props = {"kubeconfig": "k", "namespace": NS, "name": "c", "timeout": 5, "trigger": "u/1"}
    assert p.diff("id", props, dict(props)).changes is False
    assert p.diff("id", props, dict(props, trigger="u/2")).changes is True


def test_times_out_bounded_naming_conditions_and_what_to_check(kubeconfig, custom):
    _cert(custom, "pending")
    t0 = time.monotonic()
    with pytest.raises(CertificateNotReady) as e:
        CertificateReadyProvider().create(_props(kubeconfig, "pending", 1.5))
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert msg.startswith(f"Certificate {NS}/pending not Ready after 1.5 s: last conditions: no conditions yet")
    assert "ClusterIssuer acme (now: does not exist)" in msg
    assert f"Gateway {NS}/{d.GATEWAY}'s HTTP listener on port 80" in msg and "ACME server" in msg

    _set_ready(custom, "pending", "False", "DoesNotExist", "Issuing certificate as Secret does not exist")
    with pytest.raises(CertificateNotReady) as e:
        wait_ready(kubeconfig, NS, "pending", timeout=1.0, interval=0.3)
    assert "last conditions: Ready=False (DoesNotExist: Issuing certificate as Secret does not exist)" in str(e.value)


def test_missing_certificate_is_an_observation(kubeconfig):
    with pytest.raises(CertificateNotReady, match="the Certificate does not exist"):
        wait_ready(kubeconfig, NS, "nope", timeout=1.0, interval=0.3)


def test_ready_only_when_the_condition_is_set_for_the_current_generation(kubeconfig, custom):
    created = _cert(custom, "gen")
    gen = created["metadata"]["generation"]
    _set_ready(custom, "gen", "True", "Ready", "Certificate is up to date and has not expired", observed=gen - 1)
    with pytest.raises(CertificateNotReady, match=r"for generation .*Certificate is at"):
        wait_ready(kubeconfig, NS, "gen", timeout=1.0, interval=0.3)
    later = threading.Timer(1.0, lambda: _set_ready(custom, "gen", "True", "Ready",
                                                    "Certificate is up to date and has not expired", observed=gen))
    later.start()
    t0 = time.monotonic()
    out = CertificateReadyProvider().create(_props(kubeconfig, "gen", 20))
    later.join()
    assert 0.5 < time.monotonic() - t0 < 20
    assert out.id == f"{NS}/gen" and out.outs["ready"] is True
    assert out.outs["message"] == "Certificate is up to date and has not expired"


def test_footprint_network_objects_satisfy_the_lab_issuer(kubeconfig, custom):
    """ClusterIssuer, Gateway and Certificate exactly as the builders make them: the lab
    issuer stand-in issues, and CertificateReady passes."""
    issuer = CertIssuer(kubeconfig, interval=0.2, cluster="footprint-test")
    try:
        custom.create_namespaced_custom_object("cert-manager.io", "v1", NS, "certificates",
                                               d.certificate_manifest(R, Z, HUB), _request_timeout=T)
        issuer.poll_once()
        with pytest.raises(CertificateNotReady) as e:
            wait_ready(kubeconfig, NS, d.CERTIFICATE, timeout=0.5)
        assert f"ClusterIssuer {d.CLUSTER_ISSUER} (now: does not exist)" in str(e.value)
        custom.create_cluster_custom_object("cert-manager.io", "v1", "clusterissuers",
                                            d.cluster_issuer_manifest(R, Z, HUB), _request_timeout=T)
        custom.create_namespaced_custom_object("gateway.networking.k8s.io", "v1", NS, "gateways",
                                               d.gateway_manifest(R, Z, HUB), _request_timeout=T)
        custom.create_namespaced_custom_object("gateway.networking.k8s.io", "v1", NS, "httproutes",
                                               d.httproute_manifest(R, Z, HUB), _request_timeout=T)
        issuer.start()
        out = CertificateReadyProvider().create(_props(kubeconfig, d.CERTIFICATE, 30))
        assert out.outs["ready"] is True and out.outs["notAfter"]
        assert issuer.last_error is None and issuer.issued == [f"{NS}/{d.CERTIFICATE}"]
    finally:
        issuer.stop()
