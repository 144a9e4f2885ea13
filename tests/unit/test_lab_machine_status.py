"""An emulated machine's MachineStatus and kubelet, pure parts: which config changes restart the
kubelet (Talos rebuilds its KubeletSpec and secrets from them), the stage and readiness checks in
Talos's words, and what a terminated pod reports after a node shutdown."""

from __future__ import annotations

from types import SimpleNamespace

import yaml
from google.protobuf.timestamp_pb2 import Timestamp

from lab import kubelets
from lab.talos_node import machine_status
from lab.talos_node.kubelet import kubelet_inputs

BASE = {"version": "v1alpha1", "machine": {"type": "worker", "kubelet": {"image": "ghcr.io/siderolabs/kubelet:v1.35.4"},
                                          "network": {"hostname": "w1"}},
        "cluster": {"controlPlane": {"endpoint": "https://127.0.0.1:6443"}, "ca": {"crt": "Q0E="}}}


def config(**changes) -> SimpleNamespace:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    for path, value in changes.items():
        section, key = path.split("__")
        doc[section][key] = value
    return SimpleNamespace(raw=yaml.safe_dump(doc).encode())


def test_what_the_kubelet_runs_with_restarts_it_and_nothing_else_does():
    base = kubelet_inputs(config())
    assert kubelet_inputs(config(cluster__acceptedCAs=[{"crt": "TkVX"}])) != base
    assert kubelet_inputs(config(cluster__ca={"crt": "TkVX"})) != base
    assert kubelet_inputs(config(machine__kubelet={"image": "ghcr.io/siderolabs/kubelet:v1.35.5"})) != base
    assert kubelet_inputs(config(machine__kubelet={"image": BASE["machine"]["kubelet"]["image"],
                                                   "extraArgs": {"v": "2"}})) != base
    assert kubelet_inputs(config(machine__network={"hostname": "w1", "nameservers": ["1.1.1.1"]})) == base
    assert kubelet_inputs(config(machine__ca={"crt": "TkVX"})) == base


def machine(*, mode="configured", kubelet=("Running", True), node_ready=True, control_plane=False, standing="member"):
    registry = SimpleNamespace(state=lambda key: SimpleNamespace(standing=lambda address: standing),
                               has_quorum=lambda key: True, k8s_chain=lambda key: None)
    cfg = SimpleNamespace(is_control_plane=control_plane, cluster_key="k", k8s_trusted=b"")
    service = SimpleNamespace(state=kubelet[0], healthy=kubelet[1], up=kubelet == ("Running", True), events=[],
                              health_message="", health_changed=0.0)
    return SimpleNamespace(mode=mode, config=cfg, kubelet=service, node_ready=node_ready, registry=registry,
                           is_control_plane=control_plane, hostname="w1", address="127.0.0.9", booted_at=Timestamp())


def test_stage_and_readiness_in_talos_words():
    assert machine_status.status(machine()) == ("running", True, [])
    assert machine_status.status(machine(kubelet=("Waiting", False), node_ready=None)) == ("booting", False, [
        {"name": "services", "reason": "kubelet not running"},
        {"name": "nodeReady", "reason": 'node "w1" status is not available yet'}])
    assert machine_status.status(machine(node_ready=False)) == ("running", False, [
        {"name": "nodeReady", "reason": 'node "w1" is not ready'}])
    assert machine_status.status(machine(mode="rebooting")) == ("rebooting", True, [])
    assert machine_status.status(machine(mode="maintenance")) == ("maintenance", True, [])
    stage, ready, unmet = machine_status.status(machine(control_plane=True, standing="none"))
    assert (stage, ready) == ("booting", False)  # the boot sequence waits for etcd too
    assert unmet == [{"name": "services", "reason": "etcd not running"}]


def test_a_pod_ended_by_a_node_shutdown_reports_what_the_kubelet_writes():
    pod = SimpleNamespace(spec=SimpleNamespace(containers=[SimpleNamespace(name="app", image="app:1")]),
                          status=SimpleNamespace(container_statuses=None))
    status = kubelets.terminated(pod, "2026-01-01T00:00:00Z")["status"]
    assert (status["phase"], status["reason"], status["message"]) == (
        "Failed", "Terminated", "Pod was terminated in response to imminent node shutdown.")
    conditions = {c["type"]: (c["status"], c.get("reason")) for c in status["conditions"]}
    assert conditions["DisruptionTarget"] == ("True", "TerminationByKubelet") and conditions["Ready"][0] == "False"
    (container,) = status["containerStatuses"]
    assert container["state"]["running"] is None and container["state"]["terminated"]["reason"] == "Completed"
