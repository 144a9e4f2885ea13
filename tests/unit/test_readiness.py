"""The readiness gate after a reboot (kontinuum/lifecycle/readiness.py) and the CA rotation's
observed kubelet restart and Node readiness (kontinuum/talos/rotate.py): what each check
refuses, named as a user reads it."""

from __future__ import annotations

from types import SimpleNamespace

from kubernetes import client

from kontinuum.lifecycle import readiness
from kontinuum.talos.cosi import MachineStatus
from kontinuum.talos.rotate import not_ready_nodes, restarted

CP = readiness.Target("10.0.0.1", "cp-1", True)
WORKER = readiness.Target("10.0.1.1", "w-1", False)


def ready(status="True", reason=None):
    return [client.V1NodeCondition(type="Ready", status=status, reason=reason, message="m" if reason else None)]


def node(address, *, status="True", boot="b2"):
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=f"n-{address}"),
        status=client.V1NodeStatus(
            addresses=[client.V1NodeAddress(type="InternalIP", address=address)], conditions=ready(status),
            node_info=client.V1NodeSystemInfo(boot_id=boot, architecture="", container_runtime_version="",
                                              kernel_version="", kube_proxy_version="", kubelet_version="",
                                              machine_id="", operating_system="", os_image="", system_uuid="")))


def pod(name, labels, *, is_ready=True, version=None):
    annotations = {"talos.dev/config-version": version} if version else {}
    return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations),
                        status=client.V1PodStatus(conditions=[client.V1PodCondition(
                            type="Ready", status="True" if is_ready else "False")]))


def core(nodes, pods):
    return SimpleNamespace(list_node=lambda **_: SimpleNamespace(items=nodes),
                           list_namespaced_pod=lambda ns, **_: SimpleNamespace(items=pods))


CILIUM = pod("cilium-x", {"k8s-app": "cilium"})
STATIC = [pod(f"{c}-n", {"k8s-app": c}, version="3") for c in readiness.STATIC_PODS]
VERSIONS = {c: "3" for c in readiness.STATIC_PODS}


def test_a_worker_is_ready_with_its_node_ready_on_the_new_boot_and_its_cilium_agent_ready():
    assert readiness.kubernetes_problem(core([node(WORKER.address)], [CILIUM]), WORKER, "b2", {}) is None


def test_a_ready_from_before_the_reboot_does_not_count():
    problem = readiness.kubernetes_problem(core([node(WORKER.address, boot="b1")], [CILIUM]), WORKER, "b2", {})
    assert "still reports boot id b1" in problem


def test_a_node_not_ready_or_missing_is_named():
    assert "is not Ready (Ready=False" in readiness.kubernetes_problem(
        core([node(WORKER.address, status="False")], [CILIUM]), WORKER, "b2", {})
    assert "no Kubernetes Node" in readiness.kubernetes_problem(core([], []), WORKER, "b2", {})


def test_the_cilium_agent_must_run_and_be_ready_on_the_node():
    assert "no Cilium agent" in readiness.kubernetes_problem(core([node(WORKER.address)], []), WORKER, "b2", {})
    slow = pod("cilium-y", {"k8s-app": "cilium"}, is_ready=False)
    assert "cilium-y" in readiness.kubernetes_problem(core([node(WORKER.address)], [slow]), WORKER, "b2", {})


def test_a_control_plane_needs_its_static_pods_on_the_config_talos_rendered_last_and_ready():
    assert readiness.kubernetes_problem(core([node(CP.address)], [CILIUM, *STATIC]), CP, "b2", VERSIONS) is None
    old = [pod("kube-apiserver-n", {"k8s-app": "kube-apiserver"}, version="2"), *STATIC[1:]]
    assert "runs config version 2, not 3" in readiness.kubernetes_problem(
        core([node(CP.address)], [CILIUM, *old]), CP, "b2", VERSIONS)
    missing = readiness.kubernetes_problem(core([node(CP.address)], [CILIUM, *STATIC[:2]]), CP, "b2", VERSIONS)
    assert "kube-scheduler has no mirror pod" in missing


def test_machine_status_passes_only_running_and_ready():
    assert MachineStatus("running", True, ()).problem() is None
    assert "booting, not ready (nodeReady: node not ready)" in MachineStatus(
        "booting", False, ("nodeReady: node not ready",)).problem()


def test_a_kubelet_restart_is_seen_only_when_it_left_running_after_the_patch_and_runs_again():
    events = (("Running", 10.0), ("Finished", 20.0), ("Preparing", 20.5), ("Running", 21.0))
    assert restarted(events, 15.0)
    assert not restarted(events, 21.0)  # nothing after the patch yet
    assert not restarted((("Running", 10.0), ("Finished", 20.0)), 15.0)  # down, not back yet


def test_ca_rotation_counts_nodes_whose_ready_condition_is_not_true():
    nodes = {"items": [
        {"metadata": {"name": "a"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "b"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}},
        {"metadata": {"name": "c"}, "status": {}},  # no Ready condition: talosctl does not count it
    ]}
    assert not_ready_nodes(nodes) == ["b (Ready=Unknown)"]
