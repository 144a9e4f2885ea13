"""Instances and InstancePools under the real engine: discovery, races, preview, crashes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from kontinuum.hub.crds import LABEL_CLAIMED_BY
from kontinuum.hub.inventory import Inventory
from lab.hub import Hub
from lab.pulumi_cli import Stack, kill_strays
from lab.talos_node import Lab

PROJECT = Path(__file__).parent / "projects" / "pools"
HUB_ADDRESS = "127.0.0.5"


@pytest.fixture(scope="module")
def hub(tools_bin, tmp_path_factory):
    h = Hub.on_free_ports(tmp_path_factory.mktemp("hub"), HUB_ADDRESS).start()
    yield h
    h.stop()


@pytest.fixture(scope="module")
def lab():
    with Lab(pool="127.0.21.0/27", reboot_delay=0.2) as lab:
        yield lab


def stack_for(tmp_path: Path, hub: Hub, name: str, instances: list[dict], pools: list[dict],
              hub_kubeconfig: str | None = None) -> Stack:
    """A stack of the pools project, its config in a file of its own (no CLI start per key)."""
    project = tmp_path / name
    shutil.copytree(PROJECT, project)
    stack = Stack(project, "e2e", tmp_path / f"{name}-state", passphrase="e2e",
                  config_file=tmp_path / f"{name}-Pulumi.e2e.yaml").init()
    stack.write_config_file({"config": {"pools:hubKubeconfig": hub_kubeconfig or hub.kubeconfig,
                                        "pools:instances": instances, "pools:pools": pools}})
    return stack


def set_objects(stack: Stack, key: str, value) -> None:
    settings = yaml.safe_load(stack.config_file.read_text())
    settings["config"][f"pools:{key}"] = value
    stack.write_config_file(settings)


def claims(inv: Inventory, test: str) -> dict[str, str | None]:
    return {o["metadata"]["name"]: (o["metadata"].get("labels") or {}).get(LABEL_CLAIMED_BY)
            for o in inv.list({"test": test})}


def test_discovery_takes_the_first_address_that_answers(hub, lab, tmp_path):
    node = lab.add_node()
    dead = "127.0.21.30"  # nothing listens there: refused at once
    stack = stack_for(tmp_path, hub, "disc", [
        {"name": "disc-0", "interfaces": [dead, node.address], "labels": {"test": "disc"}},
    ], [])
    stack.up()
    obj = Inventory.from_kubeconfig(hub.kubeconfig).get("disc-0")
    assert obj["status"]["discovered"] is True and obj["status"]["address"] == node.address
    assert obj["status"]["talosVersion"].startswith("v1.")


def test_address_that_never_answers_fails_bounded_and_clear(hub, lab, tmp_path):
    node = lab.add_node()
    node.set_faults(hang=True)
    try:
        stack = stack_for(tmp_path, hub, "hang", [
            {"name": "hang-0", "interfaces": [node.address], "labels": {"test": "hang"}, "probeTimeout": 2},
        ], [])
        t0 = time.monotonic()
        result = stack.run("up", "--yes", "--skip-preview", check=False)
        assert result.returncode != 0 and time.monotonic() - t0 < 120
        assert "Instance hang-0: no address answered in maintenance mode" in result.stdout + result.stderr
        obj = Inventory.from_kubeconfig(hub.kubeconfig).get("hang-0")
        assert obj["status"]["discovered"] is False  # registered, and the failure is on the hub
    finally:
        node.clear_faults()


def test_two_pools_in_one_up_never_double_claim(hub, lab, tmp_path):
    nodes = lab.add_nodes(3)
    instances = [{"name": f"race-{i}", "interfaces": [n.address], "labels": {"test": "race"}}
                 for i, n in enumerate(nodes)]
    pools = [{"name": p, "selector": {"test": "race"}, "replicas": 2} for p in ("race-a", "race-b")]
    stack = stack_for(tmp_path, hub, "race", instances, pools)
    result = stack.run("up", "--yes", "--skip-preview", check=False)
    held = claims(Inventory.from_kubeconfig(hub.kubeconfig), "race")
    assert sorted(h for h in held.values() if h) in (["race-a", "race-a", "race-b"], ["race-a", "race-b", "race-b"])
    assert result.returncode != 0 and "only 3 match" in result.stdout + result.stderr  # the loser says why


def test_preview_makes_no_talos_call_and_no_hub_write(hub, lab, tmp_path):
    nodes = lab.add_nodes(2)
    instances = [{"name": f"prev-{i}", "interfaces": [n.address], "labels": {"test": "prev"}}
                 for i, n in enumerate(nodes)]
    stack = stack_for(tmp_path, hub, "prev", instances, [{"name": "prev-pool", "selector": {"test": "prev"},
                                                           "replicas": 1}])
    stack.up()
    inv = Inventory.from_kubeconfig(hub.kubeconfig)
    versions = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in inv.list({"test": "prev"})}
    for n in nodes:
        n.reset_calls()
    set_objects(stack, "pools", [{"name": "prev-pool", "selector": {"test": "prev"}, "replicas": 2}])
    preview = stack.preview()
    assert "update" in preview.stdout
    assert all(sum(n.calls.values()) == 0 for n in nodes)
    assert {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in inv.list({"test": "prev"})} == versions


def test_preview_of_a_new_stack_contacts_nothing(hub, tmp_path):
    dead_hub = hub.kubeconfig.replace(hub.server, "https://127.0.0.250:1")
    stack = stack_for(tmp_path, hub, "cold", [
        {"name": "cold-0", "interfaces": ["127.0.0.251"], "labels": {"test": "cold"}},
    ], [{"name": "cold-pool", "selector": {"test": "cold"}, "replicas": 1}], hub_kubeconfig=dead_hub)
    out = stack.preview()
    assert "cold-pool" in out.stdout and "BEGIN" not in out.stdout


def test_scale_down_releases_name_last_and_up_again_reclaims(hub, lab, tmp_path):
    nodes = lab.add_nodes(3)
    instances = [{"name": f"scale-{i}", "interfaces": [n.address], "labels": {"test": "scale"}}
                 for i, n in enumerate(nodes)]
    stack = stack_for(tmp_path, hub, "scale", instances, [{"name": "scale-pool", "selector": {"test": "scale"},
                                                            "replicas": 3}])
    stack.up()
    inv = Inventory.from_kubeconfig(hub.kubeconfig)
    set_objects(stack, "pools", [{"name": "scale-pool", "selector": {"test": "scale"}, "replicas": 1}])
    stack.up()
    assert claims(inv, "scale") == {"scale-0": "scale-pool", "scale-1": None, "scale-2": None}
    set_objects(stack, "pools", [{"name": "scale-pool", "selector": {"test": "scale"}, "replicas": 3}])
    stack.up()
    assert set(claims(inv, "scale").values()) == {"scale-pool"}
    stack.destroy()
    assert inv.list({"test": "scale"}) == []  # released and unregistered


def test_killed_up_while_claiming_converges_without_orphans(hub, lab, tmp_path):
    nodes = lab.add_nodes(2)
    instances = [{"name": f"kill-{i}", "interfaces": [n.address], "labels": {"test": "kill"}}
                 for i, n in enumerate(nodes)]
    # Three wanted, two exist: the pool claims both, then waits for capacity; kill it there.
    stack = stack_for(tmp_path, hub, "kill", instances, [{"name": "kill-pool", "selector": {"test": "kill"},
                                                           "replicas": 3, "waitSeconds": 120}])
    inv = Inventory.from_kubeconfig(hub.kubeconfig)
    proc = subprocess.Popen(stack.command("up", "--yes", "--skip-preview"), cwd=stack.project_dir, env=stack.env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while sorted(filter(None, claims(inv, "kill").values())) != ["kill-pool", "kill-pool"]:
            assert time.monotonic() < deadline and proc.poll() is None, "the pool never started claiming"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        kill_strays(stack.project_dir, stack.state_dir)
    stack.run("cancel", "--yes", check=False)  # a killed run leaves its lock behind
    set_objects(stack, "pools", [{"name": "kill-pool", "selector": {"test": "kill"}, "replicas": 2}])
    stack.up()
    assert claims(inv, "kill") == {"kill-0": "kill-pool", "kill-1": "kill-pool"}
    assert [m["name"] for m in stack.outputs()["kill-pool"]] == ["kill-0", "kill-1"]
    stack.destroy()
    assert inv.list({"test": "kill"}) == []
