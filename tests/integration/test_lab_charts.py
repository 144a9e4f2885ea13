"""The lab charts install for real: rendered by Helm's engine inside the pinned pulumi-kubernetes
provider (there is no helm binary) and applied to a real apiserver, with the values Kontinuum sets.
"""

from __future__ import annotations

import textwrap

import pytest
import yaml
from kubernetes import client, config as kconfig

from lab import crds as lab_crds
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
        "gatewayAPI": {"enabled": True, "enableAlpn": True, "enableAppProtocol": True},
        "operator": {"replicas": 1},
    })
    ns = k8s.core.v1.Namespace("cert-manager", metadata={"name": "cert-manager"}, opts=pulumi.ResourceOptions(provider=p))
    k8s.helm.v4.Chart("cert-manager", chart=cfg.require("charts") + "/cert-manager", namespace="cert-manager",
                      skip_await=True, values={"crds": {"enabled": True}, "config": {"enableGatewayAPI": True}},
                      opts=pulumi.ResourceOptions(provider=p, depends_on=[crds, ns]))
""")


def test_lab_charts_install_through_pulumi_kubernetes(apiserver, api, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: lab-charts\nruntime: python\n")
    (project / "__main__.py").write_text(PROGRAM)
    stack = Stack(project, "charts", tmp_path / "state", passphrase="lab-charts").init()
    stack.set_config("kubeconfig", apiserver.admin_kubeconfig(), secret=True)
    stack.set_config("charts", str(lab_crds.LAB / "charts"))
    stack.set_config("gatewayApi", str(lab_crds.GATEWAY_API_DIR))
    stack.up(timeout=600)

    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    agent = apps.read_namespaced_daemon_set("cilium", "kube-system", _request_timeout=T)
    pod = agent.spec.template.spec
    assert pod.host_network and [t.operator for t in pod.tolerations] == ["Exists"]
    assert "SYS_MODULE" not in pod.containers[0].security_context.capabilities.add
    assert [c.name for c in pod.init_containers] == ["apply-sysctl-overwrites", "clean-cilium-state"]  # no cgroup mount
    env = {e.name: e.value for e in pod.containers[0].env if e.value}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("localhost", "7445")

    op = apps.read_namespaced_deployment("cilium-operator", "kube-system", _request_timeout=T)
    assert op.spec.replicas == 1 and op.spec.template.spec.host_network
    assert op.spec.template.spec.containers[0].ports[0].host_port == 9963
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
    assert "--enable-gateway-api" in names["cert-manager"].spec.template.spec.containers[0].args
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition("certificates.cert-manager.io", _request_timeout=T)
    assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"
    adm = client.AdmissionregistrationV1Api(api)
    assert not adm.list_validating_webhook_configuration(_request_timeout=T).items
    assert not adm.list_mutating_webhook_configuration(_request_timeout=T).items
