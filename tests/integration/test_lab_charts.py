"""The upstream charts the lab installs (Cilium, cert-manager, Gateway API CRDs at their pins, from
their Go module zips: lab/upstream.py) install for real: rendered by Helm's engine inside the
pinned pulumi-kubernetes provider (there is no helm binary) and applied to a real apiserver, with
the values Kontinuum sets.
"""

from __future__ import annotations

import textwrap

import pytest
import yaml
from kubernetes import client, config as kconfig

from lab import upstream
from lab.pulumi_cli import Stack

T = 10


@pytest.fixture(scope="module")
def api(apiserver):
    a = kconfig.new_client_from_config_dict(yaml.safe_load(apiserver.admin_kubeconfig()))
    yield a
    a.close()


PROGRAM = textwrap.dedent("""
    import pulumi
    import pulumi_kubernetes as k8s

    cfg = pulumi.Config()
    p = k8s.Provider("zone", kubeconfig=cfg.require_secret("kubeconfig"))
    crds = k8s.yaml.v2.ConfigGroup("gateway-api", files=[cfg.require("gatewayApi") + "/*.yaml"],
                                   opts=pulumi.ResourceOptions(provider=p))
    after_crds = pulumi.ResourceOptions(provider=p, depends_on=[crds])
    k8s.helm.v4.Chart("cilium", chart=cfg.require("charts") + "/cilium", namespace="kube-system",
                      skip_await=True, opts=after_crds, values={
        "ipam": {"mode": "kubernetes"}, "kubeProxyReplacement": True,
        "securityContext": {"capabilities": {
            "ciliumAgent": ["CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_ADMIN", "SYS_RESOURCE",
                            "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"],
            "cleanCiliumState": ["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"]}},
        "cgroup": {"autoMount": {"enabled": False}, "hostRoot": "/sys/fs/cgroup"},
        "k8sServiceHost": "localhost", "k8sServicePort": 7445,
        "gatewayAPI": {"enabled": True, "enableAlpn": True, "enableAppProtocol": True,
                       "gatewayClass": {"create": "true"}},
        "operator": {"replicas": 1},
    })
    ns = k8s.core.v1.Namespace("cert-manager", metadata={"name": "cert-manager"}, opts=pulumi.ResourceOptions(provider=p))
    k8s.helm.v4.Chart("cert-manager", chart=cfg.require("charts") + "/cert-manager", namespace="cert-manager",
                      skip_await=True, values={"crds": {"enabled": True}, "config": {
                          "apiVersion": "controller.config.cert-manager.io/v1alpha1",
                          "kind": "ControllerConfiguration", "enableGatewayAPI": True}},
                      opts=pulumi.ResourceOptions(provider=p, depends_on=[crds, ns]))
""")


def test_upstream_charts_install_through_pulumi_kubernetes(apiserver, api, tmp_path):
    links = upstream.link(tmp_path / "upstream")
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: lab-charts\nruntime: python\n")
    (project / "__main__.py").write_text(PROGRAM)
    stack = Stack(project, "charts", tmp_path / "state", passphrase="lab-charts").init()
    stack.set_config("kubeconfig", apiserver.admin_kubeconfig(), secret=True)
    stack.set_config("charts", str(tmp_path / "upstream"))
    stack.set_config("gatewayApi", str(links["gateway-api"]))
    stack.up(timeout=600)

    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    agent = apps.read_namespaced_daemon_set("cilium", "kube-system", _request_timeout=T)
    pod = agent.spec.template.spec
    assert pod.host_network and [t.operator for t in pod.tolerations] == ["Exists"]
    assert "SYS_MODULE" not in pod.containers[0].security_context.capabilities.add
    inits = [c.name for c in pod.init_containers]
    assert "clean-cilium-state" in inits and "mount-cgroup" not in inits  # Talos mounts the cgroup fs
    env = {e.name: e.value for e in pod.containers[0].env if e.value}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("localhost", "7445")

    op = apps.read_namespaced_deployment("cilium-operator", "kube-system", _request_timeout=T)
    assert op.spec.replicas == 1 and op.spec.template.spec.host_network
    anti = op.spec.template.spec.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution
    assert anti[0].topology_key == "kubernetes.io/hostname"

    config = core.read_namespaced_config_map("cilium-config", "kube-system", _request_timeout=T).data
    assert config["ipam"] == "kubernetes" and config["kube-proxy-replacement"] == "true"
    assert config["enable-gateway-api"] == "true" and config["cgroup-root"] == "/sys/fs/cgroup"
    gc = client.CustomObjectsApi(api).get_cluster_custom_object(
        "gateway.networking.k8s.io", "v1", "gatewayclasses", "cilium", _request_timeout=T)
    assert gc["spec"]["controllerName"] == "io.cilium/gateway-controller"

    deployments = apps.list_namespaced_deployment("cert-manager", _request_timeout=T).items
    names = {d.metadata.labels["app.kubernetes.io/name"]: d for d in deployments}
    assert set(names) == {"cert-manager", "webhook", "cainjector"}
    assert all(d.metadata.labels["app.kubernetes.io/instance"] == "cert-manager" for d in deployments)
    controller_config = core.read_namespaced_config_map("cert-manager", "cert-manager", _request_timeout=T).data
    assert yaml.safe_load(controller_config["config.yaml"])["enableGatewayAPI"] is True
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition("certificates.cert-manager.io", _request_timeout=T)
    assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"
    adm = client.AdmissionregistrationV1Api(api)  # served by the real webhook in the lab (lab/certmanager.py)
    for cfg in (adm.read_validating_webhook_configuration("cert-manager-webhook", _request_timeout=T),
                adm.read_mutating_webhook_configuration("cert-manager-webhook", _request_timeout=T)):
        assert cfg.metadata.annotations["cert-manager.io/inject-ca-from-secret"] == "cert-manager/cert-manager-webhook-ca"
        assert {(w.client_config.service.namespace, w.client_config.service.name) for w in cfg.webhooks} == {
            ("cert-manager", "cert-manager-webhook")}


def test_cert_manager_controller_config_keys_exist_upstream():
    """Every ControllerConfiguration key our cert-manager values set is a field of the pinned
    upstream type (a misspelt key would only show as a controller that refuses its config)."""
    from kontinuum_components import addons

    art = upstream.ARTIFACTS["cert-manager"]
    types = (upstream.module_dir(art.module, art.version) / "pkg/apis/config/controller/v1alpha1/types.go").read_text()
    config = addons.cert_manager_values({})["config"]
    assert config["acmeDNS01Config"]["checkRetryPeriod"] == "2s"

    def keys(value: dict, path: str = ""):
        for k, v in value.items():
            if k in ("apiVersion", "kind"):
                continue
            yield f"{path}{k}"
            if isinstance(v, dict):
                yield from keys(v, f"{path}{k}.")

    for key in keys(config):
        assert f'json:"{key.rsplit(".", 1)[-1]},' in types or f'json:"{key.rsplit(".", 1)[-1]}"' in types, key
    # An operator's value wins over ours.
    assert addons.cert_manager_values({"config": {"acmeDNS01Config": {"checkRetryPeriod": "30s"}}})[
        "config"]["acmeDNS01Config"]["checkRetryPeriod"] == "30s"
