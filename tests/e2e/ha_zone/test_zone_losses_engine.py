"""A dead machine never blocks its zone (issue 27): the HA zone that test_zone_edits_engine left
(control planes 0, 1, 2; web workers 4 and 5) loses machines for real: the lab's crash knob
powers one off with its disk intact (its Talos API times out, its kubelet stops, its etcd member
is unreachable). Each loss is declared in the stack config (`lost: true`) and handled by one
`pulumi up`, with the Talos calls counted on every lab node: a lost machine is never called
beyond one probe, and nothing is done to a machine the edit does not name.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import yaml
from kubernetes import client
from kubernetes import config as kconfig

from kontinuum.hub.inventory import Inventory
from lab.pulumi_cli import ROOT
from lab.talos_node import control
from tests.e2e.cluster_lab import (REGION, address, all_nodes, calls, delta, events, lab_events, member, mutating,
                                   node_state, ready, seq)
from tests.e2e.ha_zone.test_zone_edits_engine import edit, machine, settings, web

T = 15  # seconds per Kubernetes API call
CP_LOST, CP_NEW = address(2), address(6)


def core(stack) -> tuple[client.ApiClient, client.CoreV1Api]:
    api = kconfig.new_client_from_config_dict(yaml.safe_load(stack.outputs(show_secrets=True)["kubeconfigs"]["ha"]))
    return api, client.CoreV1Api(api)


def node_names(c: client.CoreV1Api) -> dict[str, str]:
    """InternalIP → Node name."""
    return {a.address: n.metadata.name for n in c.list_node(_request_timeout=T).items
            for a in n.status.addresses or [] if a.type == "InternalIP"}


def mark_lost(z: dict, *addresses: str) -> None:
    for m in z["talosAddresses"]:
        if m["address"] in addresses:
            m["lost"] = True


def up(stack, tmp_path) -> tuple[dict, list[dict]]:
    """`pulumi up` with its event log; the mutating Talos calls per node and the events."""
    before = calls(all_nodes())
    log = tmp_path / "events.jsonl"
    stack.up(f"--event-log={log}")
    return mutating(delta(before, calls(all_nodes()))), events(log)


def status(stack, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kontinuum", "status", "--stack", stack.name, "--timeout", "3",
                           "--json", str(tmp_path / "status.json")], cwd=ROOT, env=stack.env(), capture_output=True,
                          text=True, timeout=120)


def test_a_crashed_worker_marked_lost_leaves_without_a_call_and_its_pods_move(zone_stack, tmp_path):
    stack, lab = zone_stack
    gone = address(4)
    api, c = core(stack)
    name = node_names(c)[gone]
    control.crash(gone)
    said = status(stack, tmp_path)  # between runs: the status names the dead node, exit 2 (unhealthy)
    assert said.returncode == 2 and f"node(s) {gone} do not answer the Talos API" in said.stdout, said.stdout
    assert json.loads((tmp_path / "status.json").read_text())[0]["zones"][0]["state"] == "unhealthy"
    edit(stack, lambda _, z: (mark_lost(z, gone), web(z).update({"replicas": 1})))
    made, _ = up(stack, tmp_path)
    assert made == {}, made  # no reset of the dead machine, no apply anywhere
    assert gone not in node_names(c)
    inv = Inventory.from_kubeconfig((lab / "hub" / "kubeconfig").read_text())
    labels = inv.get(machine(gone))["metadata"]["labels"]
    assert labels.get("kontinuum.sh/lost") == "true" and "kontinuum.sh/claimed-by" not in labels
    deadline = time.monotonic() + 120  # the pod garbage collector takes a bound pod of a deleted Node (40 s)
    while any(p.spec.node_name == name for p in c.list_pod_for_all_namespaces(_request_timeout=T).items):
        assert time.monotonic() < deadline, f"pods still bound to the deleted Node {name}"
        time.sleep(2)
    api.close()
    assert ready(stack, "ha")


def test_a_crashed_control_plane_is_replaced_in_one_up_with_the_api_answering(zone_stack, tmp_path):
    stack, _ = zone_stack
    control.crash(CP_LOST)

    def change(_, z):
        mark_lost(z, CP_LOST)
        z["talosAddresses"].append({"address": CP_NEW, "pool": "controlplane"})
    edit(stack, change)
    api, c = core(stack)
    failures, stop = [], threading.Event()

    def watch():  # the Kubernetes API answers throughout
        while not stop.wait(1.0):
            try:
                c.list_namespace(_request_timeout=5)
            except Exception as exc:  # noqa: BLE001
                failures.append(repr(exc))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        made, evs = up(stack, tmp_path)
    finally:
        stop.set()
        watcher.join(10)
    assert failures == [], failures[:3]
    assert made == {address(0): {"EtcdRemoveMemberByID": 1}, CP_NEW: {"ApplyConfiguration": 1}}, made
    removed = seq(evs, "resOutputsEvent", "TalosCluster$pulumi-python:dynamic/talos:LostMachines::e2e-ha-lost-machines")
    assert removed < seq(evs, "resourcePreEvent", member("ha", CP_NEW))  # remove the failed member, then join
    assert node_state(address(0))["etcd_members"] == sorted([address(0), address(1), CP_NEW])
    assert CP_LOST not in node_names(c) and CP_NEW in node_names(c)
    api.close()
    assert ready(stack, "ha")


def test_a_lost_machine_that_powers_on_again_is_reset_before_reuse(zone_stack, tmp_path):
    stack, _ = zone_stack
    control.power_on(CP_LOST)  # back with its old config: its etcd member was removed meanwhile
    assert node_state(CP_LOST)["mode"] == "configured"
    made, _ = up(stack, tmp_path)
    assert made == {CP_LOST: {"Reset": 1}}, made
    deadline = time.monotonic() + 30
    while node_state(CP_LOST)["mode"] != "maintenance":
        assert time.monotonic() < deadline, node_state(CP_LOST)["mode"]
        time.sleep(0.5)
    made, _ = up(stack, tmp_path)  # it answers in maintenance mode now: nothing more to do
    assert made == {}, made


def backup(stack, config_file) -> str:
    taken = subprocess.run([sys.executable, "-m", "kontinuum", "backup", "--stack", stack.name, "--zone", "ha"],
                           cwd=ROOT, env=stack.env(), capture_output=True, text=True, timeout=300)
    assert taken.returncode == 0, taken.stderr
    return taken.stdout.strip()


def test_two_lost_control_planes_are_refused_then_restored_onto_a_survivor_and_two_new_machines(zone_stack, tmp_path):
    stack, _ = zone_stack
    edit(stack, lambda _, z: z.update({"backup": {"directory": str(tmp_path / "backups")}}))
    stack.up()
    api, c = core(stack)
    c.create_namespaced_config_map("default", {"metadata": {"name": "before-the-loss"}}, _request_timeout=T)
    snapshot = backup(stack, stack.config_file)
    api.close()
    for a in (address(1), CP_NEW):
        control.crash(a)

    def change(_, z):
        mark_lost(z, address(1), CP_NEW)
        for m in z["talosAddresses"]:
            if m["address"] == CP_LOST:
                m.pop("lost")  # reset after it came back: usable again
        z["talosAddresses"].append({"address": address(3), "pool": "controlplane"})
    edit(stack, change)
    before = calls(all_nodes())
    refused = stack.run("up", "--yes", "--skip-preview", check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "not removing lost etcd members" in said and "kontinuum restore" in said, said
    assert mutating(delta(before, calls(all_nodes()))) == {}  # nothing removed, nothing joined

    restored = subprocess.run(
        [sys.executable, "-m", "kontinuum", "restore", "--stack", stack.name, "--zone", "ha", "--snapshot", snapshot,
         "--config-file", str(stack.config_file)], cwd=ROOT, env=stack.env(), capture_output=True, text=True,
        timeout=600)
    assert restored.returncode == 0, restored.stderr + lab_events(address(0))
    assert "done; etcd is back" in restored.stderr and "Now run `pulumi up`" in restored.stderr, restored.stderr
    made, _ = up(stack, tmp_path)
    assert set(made) == {CP_LOST, address(3)} and all(c == {"ApplyConfiguration": 1} for c in made.values()), made
    assert node_state(address(0))["etcd_members"] == sorted([address(0), CP_LOST, address(3)])
    api, c = core(stack)
    assert "before-the-loss" in {m.metadata.name for m in c.list_namespaced_config_map("default",
                                                                                        _request_timeout=T).items}
    assert {address(1), CP_NEW}.isdisjoint(node_names(c))
    api.close()
    assert ready(stack, "ha") and settings(stack)["config"]["kontinuum:region"] == REGION
