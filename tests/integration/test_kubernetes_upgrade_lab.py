"""The lab shows the Kubernetes versions of each node's machine config where a client sees them,
and our Kubernetes upgrade rollout drives it over real sockets: Talos mTLS ApplyConfiguration
(NO_REBOOT) to emulated nodes, the real kube-apiserver, kwok playing the kubelets.

Control plane: mirror Pods kube-system/<component>-<node> (k8s-app label, hostIP, the config's
image, talos.dev/config-version, Ready); every Node: nodeInfo.kubeletVersion of machine.kubelet.image. Addresses
127.0.47.8-15 are this module's own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum.lifecycle import kubernetes_preflight
from kontinuum.lifecycle import kubernetes_upgrade as ku
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec
from lab.cluster_manager import ClusterManager
from lab.process import wait_until
from lab.talos_node import Lab
from tests.integration import lab_cni

T = 10
CP, WORKER = "127.0.47.9", "127.0.47.10"
OLD, NEW = "1.35.4", "1.35.5"
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


@pytest.fixture(scope="module")
def tools(tools_bin: Path) -> Path:
    missing = [t for t in ("etcd", "kube-apiserver", "kwok") if not (tools_bin / t).exists()]
    if missing:
        pytest.fail(f"pinned tools missing from {tools_bin}: {', '.join(missing)}; run `make tools`")
    return tools_bin


def spec(version: str) -> ClusterSpec:
    return ClusterSpec(name="lab-k8s", endpoint=f"https://{CP}:6443", kubernetes_version=version,
                       workers=(PoolSpec("web", 1),))


def talos(bundle, address: str) -> TalosClient:
    cert = talosconfig.issue_client_cert(bundle.os)
    return TalosClient.from_talosconfig(talosconfig.parse(talosconfig.render("lab", [address], [address], bundle.os.crt, cert)))




def mirror_pods(core: client.CoreV1Api) -> dict[str, tuple[str, str, bool]]:
    """component → (host IP, image, Ready) of the control plane's mirror Pods."""
    out = {}
    for p in core.list_namespaced_pod("kube-system", label_selector="tier=control-plane", _request_timeout=T).items:
        ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        assert "kubernetes.io/config.mirror" in p.metadata.annotations and p.spec.node_name
        out[p.metadata.labels["k8s-app"]] = (p.status.host_ip, p.spec.containers[0].image, ready)
    return out


def config_versions(core: client.CoreV1Api) -> dict[str, int]:
    """component → the mirror Pod's talos.dev/config-version."""
    return {p.metadata.labels["k8s-app"]: int(p.metadata.annotations["talos.dev/config-version"])
            for p in core.list_namespaced_pod("kube-system", label_selector="tier=control-plane", _request_timeout=T).items}


def kubelets(core: client.CoreV1Api) -> dict[str, str]:
    return {next(a.address for a in n.status.addresses if a.type == "InternalIP"): n.status.node_info.kubelet_version
            for n in core.list_node(_request_timeout=T).items}


def test_mirror_pods_and_kubelet_versions_follow_the_config_and_the_rollout_drives_them(tools, tmp_path):
    bundle = secrets.generate()
    with Lab(pool="127.0.47.8/29", reboot_delay=0.1) as lab, \
            ClusterManager(lab.clusters, tmp_path / "clusters", standins=False, runner_poll=0.5):
        for a in (CP, WORKER):
            lab.add_node(a)
        TalosClient.maintenance(CP).apply_config(mc.render(spec(OLD), bundle))
        TalosClient.maintenance(WORKER).apply_config(mc.render(spec(OLD), bundle, pool="web"))
        for a in (CP, WORKER):
            lab.node(a).wait_for("configured", 10)
        cp = talos(bundle, CP)
        cp.bootstrap()
        api = kconfig.new_client_from_config_dict(yaml.safe_load(cp.kubeconfig()))
        core = client.CoreV1Api(api)

        # Nodes turn Ready once a Cilium agent pod runs on them (lab/kwok): a stand-in DaemonSet.
        wait_until("the apiserver to take the DaemonSet", lambda: lab_cni.install(api, T), 120)

        # As a kubelet publishes them: one Ready mirror Pod per static pod, on the control plane only.
        want = {c: (CP, f"registry.k8s.io/{c}:v{OLD}", True) for c in COMPONENTS}
        wait_until("the control plane's mirror Pods, Ready", lambda: mirror_pods(core) == want, 120)
        wait_until("both Nodes", lambda: kubelets(core) == {CP: f"v{OLD}", WORKER: f"v{OLD}"}, 60)
        wait_until("both Nodes Ready", lambda: all(
            c.status == "True" for n in core.list_node(_request_timeout=T).items for c in n.status.conditions
            if c.type == "Ready"), 120)
        assert {p.metadata.name for p in core.list_namespaced_pod("kube-system", label_selector="tier=control-plane",
                                                                  _request_timeout=T).items} == \
            {f"{c}-{lab.node(CP).hostname}" for c in COMPONENTS}

        # Our rollout, over the real Talos API and kube-apiserver: one component at a time, each
        # an image-only patch of the live config; each static pod's config version goes up once.
        versions = config_versions(core)
        start = max(e["seq"] for a in (CP, WORKER) for e in lab.node(a).event_log())
        before = {a: lab.node(a).calls.get("ApplyConfiguration", 0) for a in (CP, WORKER)}
        nodes = [ku.Node("cp", CP, True, mc.render(spec(NEW), bundle).decode()),
                 ku.Node("w", WORKER, False, mc.render(spec(NEW), bundle, pool="web").decode())]
        clients = {a: talos(bundle, a) for a in (CP, WORKER)}
        ctx = ku.Context(client_for=clients.__getitem__, core=core, log=lambda m: None, timeout=60)
        result = ku.rollout(ctx, ku.plan(nodes), f"v{NEW}")
        assert result == {"cp": {**{c: f"v{NEW}" for c in COMPONENTS}, "kubelet": f"v{NEW}"}, "w": {"kubelet": f"v{NEW}"}}

        events = sorted((e for a in (CP, WORKER) for e in lab.node(a).event_log() if e["seq"] > start),
                        key=lambda e: e["seq"])
        assert [(e["node"], e.get("component") or e["event"], (e.get("image") or e.get("version", "")).rsplit(":", 1)[-1])
                for e in events if e["event"] in ("static-pod", "kubelet")] == [
            (CP, "kube-apiserver", f"v{NEW}"), (CP, "kube-controller-manager", f"v{NEW}"),
            (CP, "kube-scheduler", f"v{NEW}"), (CP, "kubelet", f"v{NEW}"), (WORKER, "kubelet", f"v{NEW}")]
        assert mirror_pods(core) == {c: (CP, f"registry.k8s.io/{c}:v{NEW}", True) for c in COMPONENTS}
        assert config_versions(core) == {c: v + 1 for c, v in versions.items()}
        assert kubelets(core) == {CP: f"v{NEW}", WORKER: f"v{NEW}"}
        calls = {a: lab.node(a).calls.get("ApplyConfiguration", 0) for a in (CP, WORKER)}
        assert {a: calls[a] - before[a] for a in calls} == {CP: 4, WORKER: 1}  # one per component

        # A second rollout reads the truth and sends nothing.
        assert ku.rollout(ctx, ku.plan(nodes), f"v{NEW}") == result
        assert {a: lab.node(a).calls.get("ApplyConfiguration", 0) for a in (CP, WORKER)} == calls

        # The pre-flight's removed-API count against the real apiserver: a resource it does not
        # serve (1.32 removed it) is NotFound, so not in use; one it serves is counted.
        counts = kubernetes_preflight.api_counts(api, ["podschedulingcontexts.v1alpha3.resource.k8s.io", "nodes.v1"])
        assert counts == {"nodes.v1": 2}
        api.close()
