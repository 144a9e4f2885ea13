"""Emulated Talos clusters get real control planes: bootstrapped through our Talos client, read
through the kubeconfig the Talos API hands out, scheduled by a real kube-scheduler, with kwok as
the kubelets. Addresses 127.0.31.96-127 are this module's own (the bench lab uses 127.0.30.11 and up,
the lab CLI test 127.0.31.0-31)."""

from __future__ import annotations

import socket
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec
from kontinuum.talos.errors import ClusterUnhealthyError
from lab import upstream
from lab.cluster_manager import ClusterManager
from lab.process import pid_alive, wait_until
from lab.pulumi_cli import Stack
from lab.talos_node import Lab

T = 10  # seconds per API call
NEEDED = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "pulumi-resource-kubernetes")


@pytest.fixture(scope="module")
def tools(tools_bin: Path) -> Path:
    missing = [t for t in NEEDED if not (tools_bin / t).exists()]
    if missing:
        pytest.fail(f"pinned tools missing from {tools_bin}: {', '.join(missing)}; run `make tools`")
    return tools_bin


@pytest.fixture(scope="module")
def bundle() -> secrets.SecretsBundle:
    return secrets.generate()


def talos(bundle: secrets.SecretsBundle, address: str) -> TalosClient:
    cert = talosconfig.issue_client_cert(bundle.os)
    return TalosClient.from_talosconfig(talosconfig.parse(talosconfig.render("lab", [address], [address], bundle.os.crt, cert)))


def configure(addresses: list[str], config: bytes, lab: Lab) -> None:
    for a in addresses:
        TalosClient.maintenance(a).apply_config(config)
    for a in addresses:
        lab.node(a).wait_for("configured", 10)


def core_api(kubeconfig: str) -> client.ApiClient:
    return kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))


def listening(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((address, port)) == 0


def unhealthy(cp: TalosClient, nodes: list[str]) -> str:
    with pytest.raises(ClusterUnhealthyError) as failed:
        cp.health_check(nodes, wait_timeout=3)
    return str(failed.value)


def cilium_pods(core: client.CoreV1Api) -> list:
    return core.list_namespaced_pod("kube-system", label_selector="app.kubernetes.io/part-of=cilium",
                                    _request_timeout=T).items


def is_ready(obj) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (obj.status.conditions or []))


def cni_agents(api: client.ApiClient) -> None:
    """A DaemonSet labelled as Cilium's agent (kwok runs its pods), so the lab marks every Node's
    network ready and the Nodes turn Ready without installing the chart."""
    labels = {"app.kubernetes.io/part-of": "cilium", "k8s-app": "cilium"}
    client.AppsV1Api(api).create_namespaced_daemon_set("kube-system", {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "cilium", "labels": labels},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "hostNetwork": True, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "cilium-agent", "image": "lab.invalid/cilium-agent-stand-in:0",
                            # as the chart's k8sServiceHost sets it: the agent reaches the API through KubePrism
                            "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "localhost"},
                                    {"name": "KUBERNETES_SERVICE_PORT", "value": "7445"}]}]}}}},
        _request_timeout=T)


def crash_and_power_on(machine, survivor: TalosClient, core: client.CoreV1Api, api: client.ApiClient) -> None:
    """A crashed machine's kubelet stops: the real node lifecycle controller marks its Node Unknown
    and its pods not Ready (node-monitor-grace-period later), while etcd still lists its member.
    Powered on, it plays again and its Node turns Ready."""
    cni_agents(api)
    def every_node_ready() -> bool:
        nodes = core.list_node(_request_timeout=T).items
        if all(map(is_ready, nodes)):
            return True
        agents = core.list_namespaced_pod("kube-system", label_selector="k8s-app=cilium", _request_timeout=T).items
        raise AssertionError(f"Nodes Ready: {[is_ready(n) for n in nodes]}; agents: "
                             f"{[(p.spec.node_name, p.status.phase, is_ready(p)) for p in agents]}")

    wait_until("every Node Ready", every_node_ready, 90)
    crashed_at = time.strftime("%H:%M:%S", time.gmtime())
    machine.crash()
    assert machine.hostname in {m.hostname for m in survivor.etcd_members()}

    def unknown_and_pods_not_ready() -> bool:
        ready = [c for c in core.read_node(machine.hostname, _request_timeout=T).status.conditions or [] if c.type == "Ready"]
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={machine.hostname}", _request_timeout=T).items
        if ready and ready[0].status == "Unknown" and pods and not any(map(is_ready, pods)):
            return True
        raise AssertionError(f"Ready={ready[0].status if ready else None}, pods Ready: {[is_ready(p) for p in pods]}")

    wait_until("the crashed machine's Node Unknown and its pods not Ready", unknown_and_pods_not_ready, 120,
               on_timeout=lambda: crash_report(core, machine.hostname, crashed_at))
    machine.power_on()
    wait_until("its Node Ready again", lambda: is_ready(core.read_node(machine.hostname, _request_timeout=T)), 90)


def crash_report(core: client.CoreV1Api, name: str, crashed_at: str) -> str:
    """What a failed wait after a crash names: when it crashed, the Node's Ready condition, its
    Lease, and each pod on it with when its Ready condition last changed."""
    def ready(obj) -> str:
        c = next((c for c in obj.status.conditions or [] if c.type == "Ready"), None)
        return f"{c.status} since {c.last_transition_time:%H:%M:%S}" if c else "no Ready condition"

    node = core.read_node(name, _request_timeout=T)
    lease = client.CoordinationV1Api(core.api_client).read_namespaced_lease(name, "kube-node-lease", _request_timeout=T)
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}", _request_timeout=T).items
    return (f"crashed at {crashed_at}; Node Ready {ready(node)}; Lease held by {lease.spec.holder_identity}, "
            f"renewed {lease.spec.renew_time:%H:%M:%S}; pods: {[(p.metadata.name, p.status.phase, ready(p)) for p in pods]}")


PROGRAM = textwrap.dedent("""
    import pulumi
    import pulumi_kubernetes as k8s

    cfg = pulumi.Config()
    p = k8s.Provider("zone", kubeconfig=cfg.require_secret("kubeconfig"))
    k8s.helm.v3.Release("cilium", name="cilium", chart=cfg.require("chart"), namespace="kube-system",
                        skip_await=True, values={"operator": {"replicas": int(cfg.require("replicas"))},
                                                 # kube-proxy-free: the agents reach the API through KubePrism
                                                 "k8sServiceHost": "localhost", "k8sServicePort": 7445},
                        opts=pulumi.ResourceOptions(provider=p))
""")


def test_one_node_cluster_real_scheduler_and_cni_gated_health(tools, bundle, tmp_path):
    spec = ClusterSpec(name="lab-one", endpoint="https://127.0.31.101:6443", kubernetes_version="1.35.4")
    with Lab(pool="127.0.31.96/29", reboot_delay=0.1) as lab, ClusterManager(lab.clusters, tmp_path / "clusters") as mgr:
        node = lab.add_node("127.0.31.101")
        configure([node.address], mc.render(spec, bundle), lab)
        cp = talos(bundle, node.address)
        cp.bootstrap()
        assert "all k8s nodes to report" in unhealthy(cp, [node.address])  # the apiserver is still starting

        kubeconfig = cp.kubeconfig()  # server: the cluster endpoint, unchanged
        assert "https://127.0.31.101:6443" in kubeconfig
        api = core_api(kubeconfig)
        core = client.CoreV1Api(api)
        nodes = wait_until("the Node of the emulated machine", lambda: core.list_node(_request_timeout=T).items, 120)
        assert [n.metadata.name for n in nodes] == [node.hostname]
        wait_until("the Node to report NotReady (no CNI yet)", lambda: any(
            c.type == "Ready" and c.status == "False" and "NetworkPluginNotReady" in c.message
            for c in core.read_node(node.hostname, _request_timeout=T).status.conditions or []), 30)
        assert "all k8s nodes to report ready" in unhealthy(cp, [node.address])

        # The lab cilium chart through the real engine, with upstream's two operators.
        project = tmp_path / "project"
        project.mkdir()
        (project / "Pulumi.yaml").write_text("name: lab-cilium\nruntime: python\n")
        (project / "__main__.py").write_text(PROGRAM)
        stack = Stack(project, "cilium", tmp_path / "state", passphrase="lab-cilium").init()
        stack.set_config("kubeconfig", kubeconfig, secret=True)
        stack.set_config("chart", str(upstream.prepare("cilium")))
        stack.set_config("replicas", "2")
        stack.up(timeout=600)

        def two_operators_one_pending():
            pods = cilium_pods(core)
            operators = [p for p in pods if p.metadata.labels.get("name") == "cilium-operator"]
            agents = [p for p in pods if p.metadata.labels.get("k8s-app") == "cilium"]
            pending = [p for p in operators if not p.spec.node_name]
            running = [p for p in operators if p.spec.node_name and is_ready(p)]
            if len(agents) == 1 and is_ready(agents[0]) and len(pending) == 1 and len(running) == 1:
                return pending[0]
            return None

        pending = wait_until("one operator Ready and one Pending", two_operators_one_pending, 120)
        scheduled = next(c for c in pending.status.conditions if c.type == "PodScheduled")
        assert scheduled.status == "False" and scheduled.reason == "Unschedulable"
        assert "free ports" in scheduled.message or "anti-affinity" in scheduled.message, scheduled.message
        wait_until("the Node to turn Ready once its Cilium agent is", lambda: is_ready(core.read_node(node.hostname, _request_timeout=T)), 30)
        problem = unhealthy(cp, [node.address])
        assert "cilium to report ready" in problem and pending.metadata.name in problem, problem

        stack.set_config("replicas", "1")
        stack.up(timeout=600)
        def one_operator_and_every_pod_ready():  # the agent, its Envoy and one operator
            pods = cilium_pods(core)
            operators = [p for p in pods if p.metadata.labels.get("name") == "cilium-operator"]
            if len(operators) == 1 and all(map(is_ready, pods)):
                return True
            raise AssertionError([(p.metadata.name, p.spec.node_name, p.status.phase, is_ready(p)) for p in pods])

        wait_until("one operator and every Cilium pod Ready", one_operator_and_every_pod_ready, 120)
        progress = cp.health_check([node.address], wait_timeout=60)
        assert any("all k8s nodes to report ready: OK" in m for m in progress), progress
        api.close()


def test_three_node_cluster_runs_an_apiserver_per_control_plane_and_reset_stops_it(tools, bundle, tmp_path):
    addresses = ["127.0.31.121", "127.0.31.122", "127.0.31.123"]
    spec = ClusterSpec(name="lab-three", endpoint=f"https://{addresses[0]}:6443", kubernetes_version="1.35.4",
                       control_plane=PoolSpec(CONTROLPLANE, 3))
    with Lab(pool="127.0.31.120/29", reboot_delay=0.1) as lab, ClusterManager(lab.clusters, tmp_path / "clusters") as mgr:
        for a in addresses:
            lab.add_node(a)
        configure(addresses, mc.render(spec, bundle), lab)
        first = talos(bundle, addresses[0])
        first.bootstrap()
        kubeconfig = talos(bundle, addresses[2]).kubeconfig()  # any control plane hands out the same endpoint
        api = core_api(kubeconfig)
        core = client.CoreV1Api(api)
        nodes = wait_until("3 Nodes", lambda: len(items := core.list_node(_request_timeout=T).items) == 3 and items, 120)
        ips = sorted(a.address for n in nodes for a in n.status.addresses if a.type == "InternalIP")
        assert ips == addresses
        assert all("node-role.kubernetes.io/control-plane" in n.metadata.labels for n in nodes)
        assert not any(n.spec.taints and any(t.key == "node-role.kubernetes.io/control-plane" for t in n.spec.taints)
                       for n in nodes)  # no workers: Talos allows scheduling on control planes
        assert len({n.spec.pod_cidr for n in nodes}) == 3
        assert len(mgr.runners) == 1
        # one etcd and one of each controller; an apiserver per control plane (each starts once its kubelet runs)
        wait_until("an apiserver per control plane", lambda: sum("kube-apiserver" in n for n in mgr.pids()) == 3, 60)
        pids = mgr.pids()
        assert sorted(name.split("/")[1] for name in pids) == [
            "etcd", "kube-apiserver", f"kube-apiserver@{addresses[1]}", f"kube-apiserver@{addresses[2]}",
            "kube-controller-manager", "kube-scheduler", "kwok"]
        wait_until("an apiserver listening on every control plane", lambda: all(listening(a, 6443) for a in addresses), 120)
        crash_and_power_on(lab.node(addresses[2]), first, core, api)
        api.close()

        first.reset(graceful=True, reboot=True, system_partitions=("STATE", "EPHEMERAL"))  # the node hosting the control plane leaves
        wait_until("the control plane to stop", lambda: not mgr.runners and not any(pid_alive(p) for p in pids.values()), 60)
        assert not any(listening(a, 6443) for a in addresses)
        for a in addresses[1:]:
            talos(bundle, a).reset(graceful=False, reboot=True, system_partitions=("STATE", "EPHEMERAL"))
        for a in addresses:
            lab.node(a).wait_for("maintenance", 10)
        time.sleep(1.0)
        assert not mgr.runners and not lab.clusters.bootstrapped()
