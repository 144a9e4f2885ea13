"""Talos OS upgrades against emulated nodes over real gRPC and TLS (no Kubernetes: drain off):
the emulator's upgrade API and fault knobs, and TalosUpgrade's create/update/diff on a
3-control-plane + 1-worker cluster. Nodes 127.0.41.11+ (this module's range)."""

from __future__ import annotations

import pytest

from kontinuum.errors import ConfigError
from kontinuum.lifecycle.etcd_health import EtcdUnhealthyError
from kontinuum.lifecycle.readiness import NodeNotReadyError
from kontinuum.lifecycle.talos_upgrade import RolledBackError, UpgradeRefused
from kontinuum.talos import lifecycle
from kontinuum.talos.errors import TalosTimeoutError, WrongModeError
from lab.talos_node import Lab
from providers.talos_common import node_client
from providers.talos_upgrade import TalosUpgradeProvider, diff_talos_upgrade
from tests.integration.test_talos_providers import BOUND, Cluster

OLD, NEW = "v1.13.0", "v1.13.1"
IMAGE = "ghcr.io/siderolabs/installer:"


@pytest.fixture(scope="module")
def lab():
    with Lab(reboot_delay=0.2, pool="127.0.41.0/24") as lab:
        yield lab


@pytest.fixture(scope="module")
def cluster(lab):
    c = Cluster(lab, control_planes=3, workers=1)
    c.apply_all()
    c.bootstrap()
    return c


def props(c: Cluster, address: str, target: str = NEW, **extra) -> dict:
    return {"instance": f"m-{address}", "address": address, "role": c.roles[address], "pool": "p",
            "talosVersion": target, "installerImage": IMAGE + target, "controlPlanes": c.control_planes,
            "talosconfig": c.secrets["talosconfig"], "talosPort": 50000, "drain": False, "allowDowngrade": False,
            "timeout": BOUND, "healthTimeout": 8.0, "configPath": "zones[0]", "step": "1/4", **extra}


def events(node, kinds=("upgrade", "reboot", "upgraded", "rolled-back", "upgrade-failed")) -> list[str]:
    return [e["event"] for e in node.event_log() if e["event"] in kinds]


def test_maintenance_mode_has_no_lifecycle_service(lab):
    node = lab.add_node()
    from kontinuum.talos.client import TalosClient

    with pytest.raises(WrongModeError, match="unknown service machine.LifecycleService"):
        lifecycle.install_upgrade(TalosClient.maintenance(node.address), IMAGE + NEW, timeout=5)


def test_upgrade_installs_and_the_reboot_boots_the_new_version(cluster, lab):
    worker = lab.node(cluster.workers[0])
    client = node_client(props(cluster, worker.address))
    before = lifecycle.boot_id(client)
    lifecycle.pull_installer(client, IMAGE + NEW)
    lines = lifecycle.install_upgrade(client, IMAGE + NEW)
    assert any("installed Talos v1.13.1" in line for line in lines)
    assert client.version().tag == OLD  # the installer does not reboot
    boots = worker.boots
    lifecycle.reboot(client)
    worker.wait_for("configured", BOUND, after_boot=boots)
    assert client.version().tag == NEW and lifecycle.boot_id(client) != before
    assert events(worker)[-3:] == ["upgrade", "reboot", "upgraded"]
    # The COSI runtime Version reports it too.
    from kontinuum.talos.answers import yaml_spec
    from protos.gen.v1alpha1 import state_pb2, state_grpc

    async def get(channel, md, t):
        return await state_grpc.StateStub(channel).Get(
            state_pb2.GetRequest(namespace="runtime", type="Versions.runtime.talos.dev", id="version"), timeout=t,
            metadata=md)

    assert yaml_spec(client._run("get", 5, get).resource)["version"] == NEW


def test_failed_installer_is_a_failure_and_the_node_keeps_its_version(cluster, lab):
    worker = lab.node(cluster.workers[0])
    worker.set_faults(upgrade_fault="fail")
    try:
        with pytest.raises(lifecycle.InstallerFailedError, match="exited with code 1"):
            lifecycle.install_upgrade(node_client(props(cluster, worker.address)), IMAGE + "v1.13.2")
        assert worker.staged_version is None
    finally:
        worker.clear_faults()


def test_a_hanging_installer_is_bounded_and_one_upgrade_runs_at_a_time(cluster, lab):
    worker = lab.node(cluster.workers[0])
    worker.set_faults(upgrade_fault="hang")
    try:
        with pytest.raises(TalosTimeoutError):
            lifecycle.install_upgrade(node_client(props(cluster, worker.address)), IMAGE + "v1.13.2", timeout=1.0)
    finally:
        worker.clear_faults()


def test_an_upgraded_node_that_is_not_ready_stops_the_rollout_and_is_never_upgraded_twice(cluster, lab):
    """This cluster has no Kubernetes, so no upgraded node can pass the readiness gate: the
    first control plane is upgraded, then the step fails naming what is not ready, and a re-run
    reads its version and upgrades nothing. (The whole rollout, node after node behind the gate,
    runs on a real zone: tests/e2e/test_day2_engine.py.)"""
    provider = TalosUpgradeProvider()
    first, second = cluster.control_planes[:2]
    for node in lab.nodes:
        node.reset_calls()
    with pytest.raises(NodeNotReadyError) as err:
        provider.create(props(cluster, first, timeout=25.0))
    # Talos itself says why: its machine status waits for the Node (nodeReady), as on a real node.
    assert f"({first}) is not ready after its reboot" in str(err.value) and "nodeReady" in str(err.value)
    assert events(lab.node(first))[-3:] == ["upgrade", "reboot", "upgraded"]
    assert lab.node(second).calls.get("Upgrade", 0) == 0
    for node in lab.nodes:
        node.reset_calls()
    assert provider.update(first, {}, props(cluster, first)).outs["version"] == NEW
    assert lab.node(first).calls.get("Upgrade", 0) == 0 and lab.node(first).calls.get("Reboot", 0) == 0


def test_ab_rollback_stops_naming_node_and_both_versions(cluster, lab):
    cp = lab.node(cluster.control_planes[0])  # on v1.13.1 since the test above
    cp.set_faults(upgrade_fault="rollback")
    try:
        with pytest.raises(RolledBackError) as err:
            TalosUpgradeProvider().update("x", {}, props(cluster, cp.address, "v1.13.2"))
        text = str(err.value)
        assert cp.address in text and "v1.13.1 instead of v1.13.2" in text and "A/B rollback" in text
        assert cp.talos_version == NEW and events(cp)[-1] == "rolled-back"
    finally:
        cp.clear_faults()


def test_etcd_gate_names_the_unhealthy_member_and_touches_nothing(cluster, lab):
    down = lab.node(cluster.control_planes[2])
    target = lab.node(cluster.control_planes[0])
    down.set_faults(refuse=True)
    try:
        with pytest.raises(EtcdUnhealthyError) as err:
            TalosUpgradeProvider().update("x", {}, props(cluster, target.address, "v1.13.2"))
        assert down.address in str(err.value) and "before upgrading control plane" in str(err.value)
        assert target.staged_version is None and target.talos_version == NEW
    finally:
        down.clear_faults()


def test_version_policy_refuses_downgrades_and_skipped_minors(cluster):
    a = cluster.workers[0]
    with pytest.raises(UpgradeRefused, match="downgrade"):
        TalosUpgradeProvider().update("x", {}, props(cluster, a, OLD))
    recorded = {**props(cluster, a), "version": "v1.13.1"}
    with pytest.raises(ConfigError) as err:
        diff_talos_upgrade(recorded, props(cluster, a, OLD))
    assert str(err.value).startswith("zones[0].talosVersion:") and "allowDowngrade" in str(err.value)
    assert diff_talos_upgrade(recorded, props(cluster, a, OLD, allowDowngrade=True)).changes
    with pytest.raises(ConfigError, match="upgrade path starts at v1.11.0"):
        diff_talos_upgrade({**recorded, "version": "v1.10.7"}, props(cluster, a, "v1.13.2"))
    assert not diff_talos_upgrade(recorded, props(cluster, a, NEW, step="2/4")).changes


# --- control-plane scaling: join one at a time, leave only with quorum -------------------------


def test_control_planes_join_one_at_a_time_and_leave_only_while_etcd_is_healthy(lab):
    from providers.config_apply import ConfigApplyProvider
    from providers.node_teardown import NodeNotResetError

    c = Cluster(lab, control_planes=3)
    first, second, third = c.addresses
    ConfigApplyProvider().create(c.props(first))
    c.bootstrap()
    for joining, members in ((second, 2), (third, 3)):
        ConfigApplyProvider().create(c.props(joining))
        # create returned only once the new control plane is a healthy etcd member
        assert joining in {m.address for m in c.state.members.values()} and len(c.state.members) == members
    lab.node(second).set_faults(refuse=True)
    try:
        with pytest.raises(NodeNotResetError) as err:
            ConfigApplyProvider().delete(third, c.props(third, drain=False, resetTimeout=10.0))
        text = str(err.value)
        assert second in text and "before control plane" in text, text
        assert lab.node(third).mode == "configured" and len(c.state.members) == 3
    finally:
        lab.node(second).clear_faults()
    ConfigApplyProvider().delete(third, c.props(third, drain=False))
    assert {m.address for m in c.state.members.values()} == {first, second}
