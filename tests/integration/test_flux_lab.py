"""Seed 002 on a lab cluster: the pod-network stand-in fails a host-network client of the
Service ClusterIP before Cilium is Ready (the wait names the cause from the pod spec) and runs
it with the KubePrism override, and the REAL Flux Operator (tools/install.sh flux-operator)
reconciles a FluxInstance against the zone's real apiserver once its (kwok-played) pod runs,
with Flux's own source-controller fetching the sync source.
Addresses 127.0.43.8-15 are this module's own (127.0.43.0/24 belongs to the Flux tests)."""

from __future__ import annotations


import pytest
import yaml
from kubernetes import client

from kontinuum.kube import flux, flux_manifests
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets
from kontinuum.talos.clusterspec import ClusterSpec
from lab import crds as lab_crds
from lab import flux_operator
from lab.cluster_manager import ClusterManager
from lab.git_server import GitServer, init_repo
from lab.process import wait_until
from lab.talos_node import Lab
from tests.integration.test_lab_clusters import configure, core_api, is_ready, talos

T = 10
SIGNATURE = "dials the kubernetes Service 10.96.0.1:443 (injected by the kubelet, not overridden)"
PRISM = [{"name": "KUBERNETES_SERVICE_HOST", "value": "localhost"}, {"name": "KUBERNETES_SERVICE_PORT", "value": "7445"}]


@pytest.fixture(scope="module")
def zone(tools_bin, tmp_path_factory):
    missing = [t for t in ("etcd", "kube-apiserver", "kwok") if not (tools_bin / t).exists()]
    if missing:
        pytest.fail(f"pinned tools missing from {tools_bin}: {', '.join(missing)}; run `make tools`")
    bundle = secrets.generate()
    spec = ClusterSpec(name="flux-lab", endpoint="https://127.0.43.11:6443", kubernetes_version="1.35.4")
    work = tmp_path_factory.mktemp("flux-lab")
    with Lab(pool="127.0.43.8/29", reboot_delay=0.1) as lab, ClusterManager(lab.clusters, work) as mgr:
        node = lab.add_node("127.0.43.11")
        configure([node.address], mc.render(spec, bundle), lab)
        cp = talos(bundle, node.address)
        cp.bootstrap()
        kubeconfig = cp.kubeconfig()
        api = core_api(kubeconfig)
        core = client.CoreV1Api(api)
        wait_until("the zone's Node", lambda: core.list_node(_request_timeout=T).items, 120)
        wait_until("the kubernetes Service", lambda: core.read_namespaced_service("kubernetes", "default",
                                                                                    _request_timeout=T), 60)
        yield kubeconfig, api, mgr
        api.close()


TOLERATIONS = [{"operator": "Exists"}]  # any taint: a NotReady control plane


def pod(name: str, namespace: str, *, env=None, restart="Never") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"hostNetwork": True, "restartPolicy": restart, "tolerations": TOLERATIONS,
                     "containers": [{"name": "bootstrap", "image": "ghcr.io/example/bootstrap:1", "env": env or []}]}}


def ensure_namespace(core: client.CoreV1Api, name: str) -> None:
    try:
        core.create_namespace({"metadata": {"name": name}}, _request_timeout=T)
    except client.ApiException as e:
        if e.status != 409:
            raise
    wait_until(f"the default ServiceAccount of {name}", lambda: any(
        sa.metadata.name == "default"
        for sa in core.list_namespaced_service_account(name, _request_timeout=T).items), 60)


def container(core, namespace, name):
    p = core.read_namespaced_pod(name, namespace, _request_timeout=T)
    return p, (p.status.container_statuses or [None])[0]


def test_host_network_pod_needs_kubeprism_before_cilium(zone):
    _, api, _ = zone
    core = client.CoreV1Api(api)
    ensure_namespace(core, "flux-operator-bootstrap")
    core.create_namespaced_pod("flux-operator-bootstrap", pod("service-ip", "flux-operator-bootstrap"),
                               _request_timeout=T)
    core.create_namespaced_pod("flux-operator-bootstrap", pod("kubeprism", "flux-operator-bootstrap", env=PRISM),
                               _request_timeout=T)

    failed, status = wait_until("the ClusterIP client to fail", lambda: (c := container(
        core, "flux-operator-bootstrap", "service-ip"))[0].status.phase == "Failed" and c, 60)
    assert status.state.terminated.reason == "Error" and status.state.terminated.exit_code == 1
    assert not status.state.terminated.message, "a kubelet reports the client's words only from a termination log"
    ok = wait_until("the KubePrism client to run", lambda: is_ready(p := core.read_namespaced_pod(
        "kubeprism", "flux-operator-bootstrap", _request_timeout=T)) and p, 60)
    assert ok.status.phase == "Running"


CILIUM_STANDIN = {
    # Stands for Cilium's agent (the lab marks a node's CNI ready when this pod is Ready).
    "apiVersion": "apps/v1", "kind": "DaemonSet",
    "metadata": {"name": "cilium", "namespace": "kube-system", "labels": {"app.kubernetes.io/part-of": "cilium"}},
    "spec": {"selector": {"matchLabels": {"k8s-app": "cilium"}},
             "template": {"metadata": {"labels": {"k8s-app": "cilium", "app.kubernetes.io/part-of": "cilium"}},
                          "spec": {"hostNetwork": True, "tolerations": TOLERATIONS,
                                   "containers": [{"name": "cilium-agent", "image": "quay.io/cilium/cilium:v1.18.4",
                                                   "env": PRISM}]}}}}


def operator_deployment(namespace: str, env) -> dict:
    labels = {"app.kubernetes.io/name": "flux-operator"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "flux-operator", "namespace": namespace},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "hostNetwork": True, "tolerations": flux_manifests.PRE_CNI_TOLERATIONS,
                         "serviceAccountName": "flux-operator",
                         "containers": [{"name": "manager", "image": "ghcr.io/controlplaneio-fluxcd/flux-operator:v0.58.1",
                                         "env": env}]}}}}


def test_real_flux_operator_reconciles_the_instance_once_its_pod_runs(zone, tools_bin, tmp_path):
    if not (tools_bin / "flux-operator").exists():
        pytest.fail(f"flux-operator missing from {tools_bin}; run `make tools`")
    kubeconfig, api, mgr = zone
    sha = init_repo(tmp_path, "fleet", {"clusters/lab/a/kustomization.yaml": "resources: []\n"})
    server = GitServer(tmp_path, "127.0.43.201").start()
    try:
        _reconciles(kubeconfig, api, mgr, server.url("fleet"), sha)
    finally:
        server.stop()


def _reconciles(kubeconfig, api, mgr, url, sha):
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    lab_crds.apply(api, [yaml.safe_load(p.read_text()) for p in flux_operator.crd_files()])
    ensure_namespace(core, "flux-system")
    manifest = flux_manifests.instance_manifest(
        namespace="flux-system", version="2.9.x", registry="ghcr.io/fluxcd", components=["source-controller",
        "kustomize-controller"], kind="GitRepository", url=url, ref="refs/heads/main",
        path="clusters/lab/a", interval="1m", pull_secret=None, suspend_apps=True, apps=["apps"])

    # The operator runs as its own service account (the lab's process too), cluster-admin as the chart makes it.
    core.create_namespaced_service_account("flux-system", {"metadata": {"name": "flux-operator"}}, _request_timeout=T)
    client.RbacAuthorizationV1Api(api).create_cluster_role_binding({
        "metadata": {"name": "flux-operator"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                          "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": "flux-operator", "namespace": "flux-system"}]}, _request_timeout=T)
    # Without the override the operator's pod crash-loops on the ClusterIP: the wait says so.
    apps.create_namespaced_deployment("flux-system", operator_deployment("flux-system", []), _request_timeout=T)
    with pytest.raises(flux.FluxNotReady) as stuck:
        flux.apply_instance(kubeconfig, manifest, timeout=20)
    assert "FluxInstance flux-system/flux not Ready after 20 s" in str(stuck.value)
    assert "Flux Operator: pod flux-operator-" in str(stuck.value) and SIGNATURE in str(stuck.value), stuck.value
    assert "Error (exit code 1)" in str(stuck.value), "the kubelet reports the exit, never the lab's words"

    # With the seed's KubePrism override it runs (the lab starts the real operator for it) ...
    apps.patch_namespaced_deployment("flux-operator", "flux-system",
                                     {"spec": {"template": {"spec": {"containers": [
                                         {"name": "manager", "env": PRISM}]}}}}, _request_timeout=T)
    wait_until("the lab to run the real operator for its pod",
               lambda: any(name.endswith("/flux-operator") for name in mgr.pids()), 90)
    # ... and the operator installs Flux; its controllers need the pod network, so Ready comes after Cilium.
    apps.create_namespaced_daemon_set("kube-system", CILIUM_STANDIN, _request_timeout=T)
    revision = flux.apply_instance(kubeconfig, manifest, timeout=240)
    assert revision.startswith("v2.9."), revision
    deployments = {d.metadata.name for d in apps.list_namespaced_deployment("flux-system", _request_timeout=T).items}
    assert {"source-controller", "kustomize-controller", "flux-operator"} <= deployments
    custom = client.CustomObjectsApi(api)
    repo = custom.get_namespaced_custom_object("source.toolkit.fluxcd.io", "v1", "flux-system", "gitrepositories",
                                               "flux-system", _request_timeout=T)
    assert repo["spec"]["url"] == url and repo["spec"]["ref"] == {"name": "refs/heads/main"}
    wait_until("source-controller to fetch the ref from the Git server", lambda: (custom.get_namespaced_custom_object(
        "source.toolkit.fluxcd.io", "v1", "flux-system", "gitrepositories", "flux-system", _request_timeout=T,
    ).get("status") or {}).get("artifact", {}).get("revision") == f"refs/heads/main@sha1:{sha}", 60)
    ks = custom.get_namespaced_custom_object("kustomize.toolkit.fluxcd.io", "v1", "flux-system", "kustomizations",
                                             "flux-system", _request_timeout=T)
    assert ks["spec"]["path"] == "clusters/lab/a"
    # suspendApps: the generated sync Kustomization suspends the app Kustomizations it applies
    [patch] = ks["spec"]["patches"]
    assert patch["target"]["name"] == "^(apps)$" and '"/spec/suspend"' in patch["patch"]

    # Without a running operator, deleting the FluxInstance is bounded: its finalizer is removed.
    apps.patch_namespaced_deployment_scale("flux-operator", "flux-system", {"spec": {"replicas": 0}}, _request_timeout=T)
    wait_until("the lab to stop the operator with its pod",
               lambda: not any(name.endswith("/flux-operator") for name in mgr.pids()), 60)
    note = flux.delete_instance(kubeconfig, "flux-system", timeout=6)
    assert "did not finalize FluxInstance flux-system/flux within 6 s" in note and "finalizer was removed" in note
    wait_until("the FluxInstance to be gone", lambda: flux._get(api, "flux-system") is None, 30)
