"""A config change rolled by what it does (kontinuum/lifecycle/config_rollout.py, providers/
config_rollout.py): each node's dry run decides, reboots go one wave at a time behind the
readiness gate, a failure never leaves a node cordoned that did not reboot. Fake nodes and a
fake cluster record every step in one timeline."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kontinuum.lifecycle import config_rollout as cr
from kontinuum.lifecycle import cordons, readiness
from kontinuum.talos.answers import ApplyResult
from kontinuum.talos.errors import InvalidMachineConfigError, TalosTimeoutError, TlsTrustError
from kontinuum.talos import pki, talosconfig
from providers.config_rollout import UNKNOWN, check_config_rollout, diff_config_rollout
from providers.talos_common import config_hash

CP = [cr.Node(f"cp-{i}", f"10.0.0.{i}", "controlplane", "cp") for i in (1, 2, 3)]
W = [cr.Node(f"w-{i}", f"10.0.1.{i}", "worker", "workers") for i in (1, 2, 3)]
CONFIGS = {"cp": "cp-config", "workers": "worker-config"}


class Zone:
    """Nodes answer dry runs with `answers` (address -> reboot | live | none | new | dead) and
    record cordon, apply, ready and uncordon in `timeline`."""

    def __init__(self, answers: dict[str, str], *, fail_apply=(), not_ready=()):
        self.answers, self.fail_apply, self.not_ready = answers, set(fail_apply), set(not_ready)
        self.timeline: list[tuple[str, str]] = []
        self.cordoned: set[str] = set()

    def client_for(self, address: str):
        zone = self

        def apply_config(config, *, mode, dry_run=False, timeout=None):
            answer = zone.answers.get(address, "none")
            if answer == "dead":
                raise TalosTimeoutError(address, "apply-config", "deadline exceeded")
            if answer == "new":
                raise TlsTrustError(address, "apply-config", "certificate not trusted")
            if dry_run:
                details = "Dry run summary:\n...\nConfig diff:\n\n" + ("No changes." if answer == "none" else "- a\n+ b")
                return ApplyResult("reboot" if answer == "reboot" else "no-reboot", details, ())
            if address in zone.fail_apply:
                raise InvalidMachineConfigError(address, "apply-config", "refused")
            zone.timeline.append(("apply", address))
            return ApplyResult("reboot" if answer == "reboot" else "no-reboot", "", ())

        return SimpleNamespace(apply_config=apply_config, deadlines=SimpleNamespace(apply_config=60.0))

    def install(self, monkeypatch):
        def drain(kubeconfig, address, **_):
            self.cordoned.add(address)
            self.timeline.append(("cordon", address))

        def uncordon(kubeconfig, address, reason):
            if address in self.cordoned:
                self.cordoned.discard(address)
                self.timeline.append(("uncordon", address))
                return address

        def wait_ready(gate, target, **_):
            if target.address in self.not_ready:
                raise readiness.NodeNotReadyError(f"{target.name} is not ready after its reboot")
            self.timeline.append(("ready", target.address))

        monkeypatch.setattr(cordons.kube_drain, "cordoned_for",
                            lambda kubeconfig, address: cr.CORDON_REASON if address in self.cordoned else None)
        monkeypatch.setattr(cordons.kube_drain, "drain", drain)
        monkeypatch.setattr(cordons.kube_drain, "uncordon", uncordon)
        monkeypatch.setattr(readiness, "wait_ready", wait_ready)
        monkeypatch.setattr(cr.lifecycle, "boot_id", lambda client: "boot-1")
        monkeypatch.setattr(cr.etcd_health, "wait_healthy",
                            lambda *a, why, **k: self.timeline.append(("etcd", why.rsplit(" ", 1)[-1])))

    def gate(self):
        return readiness.Gate(client_for=self.client_for, kubeconfig=lambda: "kubeconfig",
                              control_planes=tuple(n.address for n in CP))


SETTINGS = cr.Settings(max_unavailable=1, drain=True, drain_control_planes=False, timeout=60.0,
                       health_timeout=30.0, drain_timeout=30.0)


def rollout(zone: Zone, monkeypatch, settings=SETTINGS, nodes=(*CP, *W)):
    zone.install(monkeypatch)
    steps = cr.plan(zone.gate(), nodes, CONFIGS, 5.0)
    cr.roll(cr.Context(gate=zone.gate(), log=lambda _: None), settings, steps, CONFIGS)
    return steps


def test_a_reboot_change_rolls_control_planes_first_then_one_worker_at_a_time(monkeypatch):
    zone = Zone({n.address: "reboot" for n in (*CP, *W)})
    rollout(zone, monkeypatch, nodes=(*W, *CP))  # listed workers first: control planes still go first
    cps = [e for e in zone.timeline if e[1].startswith("10.0.0.")]
    assert cps == [x for a in ("10.0.0.1", "10.0.0.2", "10.0.0.3")
                   for x in (("etcd", a), ("apply", a), ("ready", a))]  # control planes are not drained by default
    workers = [e for e in zone.timeline if e[1].startswith("10.0.1.")]
    assert workers == [x for a in ("10.0.1.1", "10.0.1.2", "10.0.1.3")
                       for x in (("cordon", a), ("apply", a), ("ready", a), ("uncordon", a))]
    assert zone.timeline.index(("ready", "10.0.0.3")) < zone.timeline.index(("cordon", "10.0.1.1"))


def test_max_unavailable_reboots_that_many_workers_together_and_waits_for_all(monkeypatch):
    zone = Zone({n.address: "reboot" for n in W})
    rollout(zone, monkeypatch, settings=cr.Settings(2, True, False, 60.0, 30.0, 30.0))
    t = zone.timeline
    assert t.index(("apply", "10.0.1.2")) < t.index(("ready", "10.0.1.1"))  # one wave: both down together
    assert t.index(("ready", "10.0.1.2")) < t.index(("cordon", "10.0.1.3"))  # the next waits for both
    assert not zone.cordoned


def test_live_unchanged_and_new_nodes_are_left_to_their_config_apply(monkeypatch):
    zone = Zone({"10.0.0.1": "live", "10.0.0.2": "none", "10.0.0.3": "new", "10.0.1.1": "live"})
    steps = rollout(zone, monkeypatch)
    assert zone.timeline == []
    assert [s.action for s in steps] == [cr.LIVE, cr.NONE, cr.NEW, cr.LIVE, cr.NONE, cr.NONE]
    assert cr.describe(steps, 1) == ["live, no reboot: cp-1, w-1"]


def test_the_plan_says_which_nodes_reboot_in_which_order():
    steps = [cr.Step(n, cr.REBOOT) for n in (*W, CP[1])] + [cr.Step(CP[0], cr.LIVE)]
    assert cr.describe(steps, 2) == [
        "wave 1: reboot cp-2 (10.0.0.2)", "wave 2: reboot w-1 (10.0.1.1), w-2 (10.0.1.2)",
        "wave 3: reboot w-3 (10.0.1.3)", "live, no reboot: cp-1"]
    assert cr.describe([], 1) == ["no node reboots"]


def test_a_node_that_does_not_answer_stops_everything_before_any_change_and_names_the_way_out(monkeypatch):
    zone = Zone({"10.0.0.1": "reboot", "10.0.1.2": "dead"})
    with pytest.raises(cr.NodeUnansweredError, match=r"w-2 \(10.0.1.2\).*Nothing was changed.*lost: true"):
        rollout(zone, monkeypatch)
    assert zone.timeline == []


def test_a_failed_apply_uncordons_the_node_and_stops_the_rollout(monkeypatch):
    zone = Zone({n.address: "reboot" for n in W}, fail_apply={"10.0.1.2"})
    with pytest.raises(InvalidMachineConfigError):
        rollout(zone, monkeypatch)
    assert ("uncordon", "10.0.1.2") in zone.timeline and not zone.cordoned
    assert ("cordon", "10.0.1.3") not in zone.timeline


def test_a_node_not_ready_after_its_reboot_stays_cordoned_and_the_error_says_so(monkeypatch):
    zone = Zone({n.address: "reboot" for n in W}, not_ready={"10.0.1.1"})
    with pytest.raises(readiness.NodeNotReadyError, match="stays cordoned"):
        rollout(zone, monkeypatch)
    assert zone.cordoned == {"10.0.1.1"}
    assert ("cordon", "10.0.1.2") not in zone.timeline


def test_a_resumed_rollout_skips_nodes_already_done_and_uncordons_ours(monkeypatch):
    zone = Zone({"10.0.1.1": "none", "10.0.1.2": "reboot"})
    zone.cordoned.add("10.0.1.1")  # a killed run rebooted it and stopped before the uncordon
    rollout(zone, monkeypatch)
    assert zone.timeline[:2] == [("ready", "10.0.1.1"), ("uncordon", "10.0.1.1")]
    assert ("apply", "10.0.1.1") not in zone.timeline and ("apply", "10.0.1.2") in zone.timeline


# --- the provider's check and diff --------------------------------------------------------------

@pytest.fixture(scope="module")
def tc() -> str:
    ca = pki.new_ca(organizations=["talos"], key_type="ed25519")
    return talosconfig.render("eu-a", ["10.0.0.1"], [], ca.crt, talosconfig.issue_client_cert(ca))


def props(tc, **over):
    base = {"zone": "eu-a", "talosconfig": tc, "configs": dict(CONFIGS), "maxUnavailable": 1,
            "nodes": [{"name": n.name, "address": n.address, "role": n.role, "pool": n.pool} for n in (*CP, *W)]}
    return {**base, **over}


def test_max_unavailable_must_be_a_whole_number_of_nodes(tc):
    failures = check_config_rollout({}, props(tc, maxUnavailable=0)).failures
    assert [f.property for f in failures] == ["maxUnavailable"]


def test_the_preview_says_unknown_until_apply_when_the_new_config_is_not_known(tc):
    unknown = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
    news = check_config_rollout(props(tc), props(tc, configs={"cp": unknown, "workers": "w2"})).news
    assert news["plan"][0].startswith(UNKNOWN)


def test_no_change_no_plan_and_no_diff(tc):
    assert check_config_rollout(props(tc), props(tc)).news["plan"] == []
    recorded = {"configHashes": {p: config_hash(c) for p, c in CONFIGS.items()}}
    assert not diff_config_rollout(recorded, props(tc)).changes
    assert diff_config_rollout(recorded, props(tc, configs={**CONFIGS, "workers": "changed"})).changes


def test_talos_refusing_a_live_apply_is_told_apart_and_its_diff_with_secrets_is_dropped():
    from grpclib.const import Status

    from kontinuum.talos.errors import InvalidMachineConfigError, NeedsRebootError, from_status

    refused = from_status("10.0.0.1", "apply-config", Status.INVALID_ARGUMENT,
                          "this config change can't be applied in immediate mode\ndiff:\n-  key: c2VjcmV0\n+  key: bmV3")
    assert isinstance(refused, NeedsRebootError) and "c2VjcmV0" not in str(refused) and "rollout" in str(refused)
    invalid = from_status("10.0.0.1", "apply-config", Status.INVALID_ARGUMENT, "1 error occurred: bad cluster name")
    assert type(invalid) is InvalidMachineConfigError and "bad cluster name" in str(invalid)


def test_the_engine_hands_numbers_as_floats_and_the_plan_still_counts_nodes():
    steps = [cr.Step(n, cr.REBOOT) for n in W]
    assert cr.describe(steps, int(2.0))[0] == "wave 1: reboot w-1 (10.0.1.1), w-2 (10.0.1.2)"
