"""The two ends of a Kubernetes upgrade over real sockets (issue 17): the pre-pull (Talos
MachineService.ImagePull on emulated nodes) and the bootstrap-manifest sync (COSI Manifest
resources rendered from the node's current config → server-side apply on the real kube-apiserver,
kube-controller-manager rolling the DaemonSet out, kwok playing the kubelets).

One lab, one zone (a control plane with kube-proxy enabled and a worker), in order: a pull the
registry refuses stops the rollout before any node is changed, naming node and image; then the
rollout pulls each target image once per node and moves kube-proxy's DaemonSet to the target image
only at the manifest step (Talos itself created it with the old image and never updates it).
Addresses 127.0.49.8-15 are this module's own."""

from __future__ import annotations

import time

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum.lifecycle import kubernetes_upgrade as ku
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec
from lab.cluster_manager import ClusterManager
from lab.process import wait_until
from lab.talos_node import Lab
from tests.integration import lab_cni
from tests.integration.test_kubernetes_upgrade_lab import talos, tools  # noqa: F401 - tools: a fixture

T = 10
CP, WORKER = "127.0.49.9", "127.0.49.10"
OLD, NEW = "1.35.4", "1.35.5"
PROXY = "registry.k8s.io/kube-proxy"




def render(version: str, bundle, pool: str = "controlplane") -> str:
    """The zone's config with kube-proxy enabled (Kontinuum disables it by default: Cilium replaces it)."""
    spec = ClusterSpec(name="lab-k8s-m", endpoint=f"https://{CP}:6443", kubernetes_version=version,
                       workers=(PoolSpec("web", 1),))
    docs = list(yaml.safe_load_all(mc.render(spec, bundle, pool=pool)))
    proxy = docs[0]["cluster"].setdefault("proxy", {})
    proxy.update(disabled=False, image=f"{PROXY}:v{version}")
    return yaml.safe_dump_all(docs, sort_keys=False)


def proxy_ds(apps: client.AppsV1Api):
    try:
        return apps.read_namespaced_daemon_set("kube-proxy", "kube-system", _request_timeout=T)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


@pytest.mark.usefixtures("tools")
def test_prepull_then_manifest_sync_moves_kube_proxy_only_at_the_manifest_step(tmp_path):
    bundle = secrets.generate()
    with Lab(pool="127.0.49.8/29", reboot_delay=0.1) as lab, \
            ClusterManager(lab.clusters, tmp_path / "clusters", standins=False, runner_poll=0.5):
        for a in (CP, WORKER):
            lab.add_node(a)
        TalosClient.maintenance(CP).apply_config(render(OLD, bundle))
        TalosClient.maintenance(WORKER).apply_config(render(OLD, bundle, "web"))
        for a in (CP, WORKER):
            lab.node(a).wait_for("configured", 10)
        cp = talos(bundle, CP)
        cp.bootstrap()
        api = kconfig.new_client_from_config_dict(yaml.safe_load(cp.kubeconfig()))
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        wait_until("the apiserver to take the DaemonSet", lambda: lab_cni.install(api, T), 120)

        # Talos (the lab) creates the bootstrap manifests' objects once, from the config of the day.
        wait_until("kube-proxy's DaemonSet, created by Talos", lambda: proxy_ds(apps) is not None, 120)
        assert proxy_ds(apps).spec.template.spec.containers[0].image == f"{PROXY}:v{OLD}"
        wait_until("both Nodes Ready on the old version", lambda: sorted(
            (n.status.node_info.kubelet_version, c.status) for n in core.list_node(_request_timeout=T).items
            for c in n.status.conditions if c.type == "Ready") == [(f"v{OLD}", "True")] * 2, 120)
        wait_until("the control plane's mirror Pods", lambda: len(core.list_namespaced_pod(
            "kube-system", label_selector="tier=control-plane", _request_timeout=T).items) == 3, 120)

        nodes = [ku.Node("cp", CP, True, render(NEW, bundle)), ku.Node("w", WORKER, False, render(NEW, bundle, "web"))]
        clients = {a: talos(bundle, a) for a in (CP, WORKER)}
        logged: list[str] = []
        ctx = ku.Context(client_for=clients.__getitem__, core=core, log=logged.append, timeout=90)

        # 1. The registry has no such kubelet image for the worker: nothing is changed anywhere.
        lab.node(WORKER).set_faults(pull_fault=f"kubelet:v{NEW}")
        try:
            with pytest.raises(ku.KubernetesUpgradeError) as err:
                ku.rollout(ctx, ku.plan(nodes), f"v{NEW}")
        finally:
            lab.node(WORKER).set_faults(pull_fault="")
        assert f"w ({WORKER}) could not pull ghcr.io/siderolabs/kubelet:v{NEW}" in str(err.value)
        assert "This run changed no node" in str(err.value)
        assert all(lab.node(a).calls.get("ApplyConfiguration", 0) == 1 for a in (CP, WORKER))  # the first config only

        # 2. The rollout: every target image pulled once per node, in talosctl's namespaces, first.
        start = max(e["seq"] for a in (CP, WORKER) for e in lab.node(a).event_log())
        steps = ku.plan(nodes)
        ctx_steps = ku.Context(client_for=clients.__getitem__, core=core, log=logged.append, timeout=90,
                               sync_manifests=False)
        ku.rollout(ctx_steps, steps, f"v{NEW}")
        events = [e for a in (CP, WORKER) for e in lab.node(a).event_log() if e["seq"] > start]
        events.sort(key=lambda e: e["seq"])
        pulled = [(e["node"], e["image"].rsplit("/", 1)[1], e["namespace"]) for e in events if e["event"] == "pulled"]
        assert pulled == [(CP, f"{c}:v{NEW}", "NS_CRI") for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")] + \
            [(CP, f"kubelet:v{NEW}", "NS_SYSTEM"), (WORKER, f"kubelet:v{NEW}", "NS_SYSTEM")]
        first_change = next(i for i, e in enumerate(events) if e["event"] in ("static-pod", "kubelet"))
        assert all(e["event"] != "pulled" for e in events[first_change:])  # every pull before any change

        # The control plane's live config now names the target kube-proxy image (the rollout's
        # image-only patch after the static pods, talosctl's phase 3), so its kube-proxy manifest
        # has it, yet Talos does not update existing objects: the DaemonSet keeps the old image.
        assert "kube-proxy:v" + NEW in clients[CP].machine_config()
        time.sleep(2)  # a few lab ticks
        assert proxy_ds(apps).spec.template.spec.containers[0].image == f"{PROXY}:v{OLD}"

        # 3. The manifest step moves it, server-side applied as `talos`, and waits for the rollout.
        synced = ku.sync_manifests(ctx, steps)
        assert "DaemonSet kube-system/kube-proxy" in synced and "ConfigMap kube-system/kubeconfig-in-cluster" in synced
        ds = proxy_ds(apps)
        assert ds.spec.template.spec.containers[0].image == f"{PROXY}:v{NEW}"
        assert ds.status.updated_number_scheduled == ds.status.desired_number_scheduled == ds.status.number_available == 2
        managers = {(f.manager, f.operation) for f in ds.metadata.managed_fields}
        assert ("talos", "Apply") in managers, managers
        assert not [e for e in lab.node(CP).event_log() if e["event"] == "manifest-created" and e["seq"] > start]

        # A whole second rollout reads the truth: no apply, no pull; the sync changes nothing.
        calls = {a: dict(lab.node(a).calls) for a in (CP, WORKER)}
        generation = ds.metadata.generation
        ku.rollout(ctx, steps, f"v{NEW}")
        assert {a: (lab.node(a).calls.get("ApplyConfiguration"), lab.node(a).calls.get("ImagePull")) for a in (CP, WORKER)} == \
            {a: (calls[a].get("ApplyConfiguration"), calls[a].get("ImagePull")) for a in (CP, WORKER)}
        assert proxy_ds(apps).metadata.generation == generation
        api.close()
