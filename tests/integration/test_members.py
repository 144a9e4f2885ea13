"""Membership by identity against a real hub (kube-apiserver with our CRDs) and emulated
nodes: pools hold exactly the named machines, discovery happens once, and a maintenance
apply only reaches the machine discovery saw."""

from __future__ import annotations

import time

import pytest

from kontinuum.hub.crds import LABEL_CLAIMED_BY
from kontinuum.hub.inventory import Inventory, MembersUnavailable
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec
from lab.hub import Hub
from lab.talos_node import Lab
from providers.config_apply import ConfigApplyProvider
from providers.instance import InstanceProvider
from providers.instance_pool import InstancePoolProvider
from providers.talos_secrets import TalosSecretsProvider

BOUND = 20.0
LABELS = {"kontinuum.sh/region": "t", "kontinuum.sh/zone": "m", "kontinuum.sh/pool": "controlplane"}


@pytest.fixture(scope="module")
def hub(tools_bin, tmp_path_factory):
    h = Hub.on_free_ports(tmp_path_factory.mktemp("hub"), "127.0.0.4").start()
    yield h
    h.stop()


@pytest.fixture(scope="module")
def lab():
    with Lab(reboot_delay=0.2) as lab:
        yield lab


@pytest.fixture
def inv(hub):
    return Inventory.from_kubeconfig(hub.kubeconfig)


def _holder(inv: Inventory, name: str) -> str | None:
    return (inv.get(name)["metadata"].get("labels") or {}).get(LABEL_CLAIMED_BY)


def test_pool_holds_exactly_the_named_machines(inv):
    for n in ("nm-a", "nm-b", "nm-c"):
        inv.register(n, ["127.0.9.1"], {"test": "named"})
    state = inv.claim_named("pool-n", {"nm-a": ["127.0.9.1"], "nm-c": ["127.0.9.1"]}, {"test": "named"})
    assert [m.name for m in state.members] == ["nm-a", "nm-c"] and _holder(inv, "nm-b") is None
    state = inv.claim_named("pool-n", {"nm-c": ["127.0.9.1"], "nm-b": ["127.0.9.1"]}, {"test": "named"})
    assert state.released == ["nm-a"] and [m.name for m in state.members] == ["nm-c", "nm-b"]
    assert _holder(inv, "nm-a") is None and _holder(inv, "nm-c") == "pool-n"


def test_a_member_deleted_out_of_band_is_registered_again_and_keeps_its_place(inv):
    inv.register("oob-a", ["127.0.9.2"], {"test": "oob"})
    inv.claim_named("pool-o", {"oob-a": ["127.0.9.2"]}, {"test": "oob"})
    inv.unregister("oob-a")
    state = inv.claim_named("pool-o", {"oob-a": ["127.0.9.2"]}, {"test": "oob"})
    assert [m.name for m in state.members] == ["oob-a"]
    obj = inv.get("oob-a")
    assert obj["spec"]["interfaces"] == ["127.0.9.2"] and obj["metadata"]["labels"]["test"] == "oob"


def test_a_member_held_elsewhere_fails_bounded_naming_the_holder(inv):
    inv.register("held-a", ["127.0.9.3"], {"test": "held"})
    inv.claim_named("other", {"held-a": ["127.0.9.3"]}, {"test": "held"})
    started = time.monotonic()
    with pytest.raises(MembersUnavailable) as err:
        inv.claim_named("pool-h", {"held-a": ["127.0.9.3"]}, {"test": "held"}, wait=1.0, interval=0.3)
    assert time.monotonic() - started < 5
    assert "held-a: held by pool other" in str(err.value)


def test_pool_check_refuses_swapping_every_control_plane_at_once():
    p = InstancePoolProvider()
    olds = {"pool": "t-m-controlplane", "selector": LABELS, "replicas": 1, "hubKubeconfig": "x",
            "machines": {"t-m-aaaaaaaa": ["127.0.9.4"]}, "keepOneMember": True}
    swap = {**olds, "machines": {"t-m-bbbbbbbb": ["127.0.9.5"]}}
    failures = p.check(olds, swap).failures
    assert [f.property for f in failures] == ["machines"]
    assert "every member would change at once" in failures[0].reason and "Add the new machine first" in failures[0].reason
    grow = {**olds, "replicas": 3, "machines": {"t-m-aaaaaaaa": [], "t-m-bbbbbbbb": [], "t-m-cccccccc": []}}
    assert p.check(olds, grow).failures == []
    assert p.check({}, swap).failures == []  # a new pool has nothing to lose


class _Zone:
    """One control plane's inputs: a fresh cluster identity, a hub Instance for the node."""

    def __init__(self, hub, lab, name: str):
        self.node = lab.add_node()
        self.name = name
        self.hub = hub
        outs = TalosSecretsProvider().create({"clusterName": "m", "endpoints": [self.node.address]}).outs
        bundle = secrets.load(outs["secretsYaml"])
        spec = ClusterSpec(name="m", endpoint=f"https://{self.node.address}:6443", kubernetes_version="1.35.4")
        self.config = mc.render(spec, bundle, pool=CONTROLPLANE).decode()
        self.talosconfig = outs["talosconfig"]

    def instance(self, **extra) -> dict:
        return {"name": self.name, "interfaces": [self.node.address], "labels": LABELS,
                "hubKubeconfig": self.hub.kubeconfig, "talosPort": 50000, "probeTimeout": 5.0,
                "unregisterOnDelete": False, **extra}

    def apply(self) -> dict:
        return {"instance": self.name, "pool": "controlplane", "address": self.node.address, "role": "controlplane",
                "config": self.config, "talosconfig": self.talosconfig, "hubKubeconfig": self.hub.kubeconfig,
                "talosPort": 50000, "applyTimeout": BOUND, "resetTimeout": BOUND, "wipe": "state"}


def test_discovery_is_recorded_once_and_never_marks_a_configured_node_undiscovered(hub, lab, inv):
    z = _Zone(hub, lab, "t-m-disc0001")
    outs = InstanceProvider().create(z.instance()).outs
    assert outs["discovered"] and outs["fingerprint"] == z.node.fingerprint
    ConfigApplyProvider().create(z.apply())
    z.node.reset_calls()
    changed = z.instance(probeTimeout=7.0)
    assert InstanceProvider().update(z.name, outs, changed).outs["discovered"] is True
    assert InstanceProvider().read(z.name, changed).outs["discovered"] is True
    assert z.node.calls == {}  # neither update nor refresh probed the configured node
    assert inv.get(z.name)["status"]["discovered"] is True
    # Registered again after an out-of-band delete: the configured machine counts as discovered.
    inv.unregister(z.name)
    again = InstanceProvider().create(z.instance()).outs
    assert again["discovered"] is True and again["address"] == z.node.address
    assert inv.get(z.name)["status"]["conditions"][0]["reason"] == "Configured"


def test_maintenance_apply_refuses_a_machine_discovery_did_not_see(hub, lab, inv):
    z = _Zone(hub, lab, "t-m-pin00001")
    recorded = InstanceProvider().create(z.instance()).outs["fingerprint"]
    z.node.reboot()  # a new maintenance identity: as good as another machine at this address
    z.node.wait_for("maintenance", 10, after_boot=1)
    assert z.node.fingerprint != recorded
    with pytest.raises(Exception) as err:
        ConfigApplyProvider().create(z.apply())
    text = str(err.value)
    assert recorded in text and z.node.fingerprint in text and "--replace" in text
    assert "ApplyConfiguration" not in z.node.calls and z.node.mode == "maintenance"


def test_reset_records_the_new_certificate_so_the_machine_can_rejoin(hub, lab, inv):
    z = _Zone(hub, lab, "t-m-back0001")
    InstanceProvider().create(z.instance())
    outs = ConfigApplyProvider().create(z.apply())
    ConfigApplyProvider().delete(z.name, {**outs.outs, "talosconfig": z.talosconfig,
                                          "hubKubeconfig": z.hub.kubeconfig})
    assert z.node.mode == "maintenance" and z.node.calls.get("Reset") == 1
    assert inv.get(z.name)["status"]["fingerprint"] == z.node.fingerprint
    ConfigApplyProvider().create(z.apply())  # scaled back up: the same machine, pinned again
    assert z.node.mode == "configured"
