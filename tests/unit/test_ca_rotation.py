"""Phase planning of a CA rotation (talosctl rotate-ca's order, day-2 facts §4): which phase a
node's config is in, what each patch changes, which phase is due for a set of nodes (a kill
mid-phase resumes it, never a later one), and the plan a preview prints."""

from __future__ import annotations

import dataclasses

import pytest

from kontinuum.talos import ca_rotation as cr
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec
from lab.talos_node import machineconfig as lab_mc

BUNDLE = secrets.generate()
SPEC = ClusterSpec(name="rot", endpoint="https://127.0.48.1:6443", kubernetes_version="1.35.4",
                   workers=(PoolSpec("web", 1),))
CP = mc.render(SPEC, BUNDLE).decode()
WORKER = mc.render(SPEC, BUNDLE, pool="web").decode()
NEW = secrets.generate()


# Ids by name: the generated bundles differ per process, and pytest-xdist's workers must collect the same ids.
@pytest.mark.parametrize("kind,old,new", [("talos", BUNDLE.os, NEW.os), ("kubernetes", BUNDLE.k8s, NEW.k8s)],
                         ids=["talos", "kubernetes"])
@pytest.mark.parametrize("config,control_plane", [(CP, True), (WORKER, False)], ids=["controlplane", "worker"])
def test_each_phase_moves_a_node_one_state_on_and_is_idempotent(kind, old, new, config, control_plane):
    assert cr.state_of(cr.node_cas(config, kind), old.crt, new.crt) == cr.START
    for phase, state in zip(cr.PHASES, cr.STATES[1:]):
        config = cr.patch(config, kind, phase, old=old.crt, new=new, control_plane=control_plane)
        assert cr.state_of(cr.node_cas(config, kind), old.crt, new.crt) == state
        again = cr.patch(config, kind, phase, old=old.crt, new=new, control_plane=control_plane)
        assert cr.node_cas(again, kind) == cr.node_cas(config, kind)  # a resumed phase changes nothing
        lab_mc.parse(config.encode())  # every intermediate config is one Talos takes
    section = cr._documents(config)[0][cr.SECTION[kind]]
    assert "acceptedCAs" not in section  # the old CA is gone
    assert ("key" in section["ca"]) == control_plane  # workers never get a CA key


def test_swap_keeps_the_old_ca_accepted_and_the_other_kind_untouched():
    swapped = cr.patch(cr.patch(CP, "talos", "accept", old=BUNDLE.os.crt, new=NEW.os, control_plane=True),
                       "talos", "swap", old=BUNDLE.os.crt, new=NEW.os, control_plane=True)
    cas = cr.node_cas(swapped, "talos")
    assert cas.issuing == NEW.os.crt and cas.accepted == (BUNDLE.os.crt,)
    assert cr.node_cas(swapped, "kubernetes") == cr.node_cas(CP, "kubernetes")
    applied = lab_mc.parse(swapped.encode())
    assert applied.trusted_cas == NEW.os.crt + BUNDLE.os.crt  # apid accepts clients of both CAs


def test_a_node_of_another_ca_is_refused():
    stranger = secrets.generate().os
    with pytest.raises(cr.RotationError, match="neither the old nor the new"):
        cr.state_of(cr.node_cas(CP, "talos"), stranger.crt, NEW.os.crt)


@pytest.mark.parametrize("states,due", [
    ([cr.START, cr.START], "accept"),
    ([cr.ACCEPTED, cr.START], "accept"),  # killed during accept: accept resumes on the rest
    ([cr.SWAPPED, cr.ACCEPTED], "swap"),  # killed during swap
    ([cr.SWAPPED, cr.SWAPPED], "drop"),
    ([cr.DONE, cr.SWAPPED], "drop"),  # killed during drop
    ([cr.DONE, cr.DONE], None),
    ([], None),
])
def test_the_due_phase_is_the_one_the_slowest_node_needs(states, due):
    assert cr.due_phase(states) == due


def test_the_plan_names_every_phase_in_talosctl_order():
    lines = cr.plan(["talos", "kubernetes"], ["127.0.48.11", "127.0.48.12"])
    assert len(lines) == 8 and lines[0].startswith("Talos API CA: 1. accept") and "127.0.48.12" in lines[0]
    assert [line.split(": ", 1)[1][:2] for line in lines] == ["1.", "2.", "3.", "4."] * 2
    assert lines[4].startswith("Kubernetes CA: 1. accept") and "drop the old CA" in lines[7]
    assert not any("BEGIN" in line for line in lines)


# --- the stack side: TalosSecrets starts a rotation, CaRotation knows when one is due -------------


def test_a_changed_token_retires_the_ca_and_makes_a_new_one_the_bundles():
    import yaml

    from providers.ca_rotation import due
    from providers.talos_secrets import TalosSecretsProvider

    p = TalosSecretsProvider()
    props = {"clusterName": "rot", "endpoints": ["127.0.48.11"], "rotate": {"talos": "a"}, "renewBeforeDays": 30}
    created = p.create(props).outs  # a token present at creation rotates nothing
    assert created["retiringYaml"] == "" and due({**props, **created}, {"talos": "a"}) == []
    assert not p.diff("rot", created, props).changes
    news = {**props, "rotate": {"talos": "a", "kubernetes": "b"}}
    assert p.diff("rot", created, news).changes
    updated = p.update("rot", created, news).outs
    before, after = secrets.load(created["secretsYaml"]), secrets.load(updated["secretsYaml"])
    assert after.os == before.os and after.k8s != before.k8s and after.cluster_id == before.cluster_id
    retiring = yaml.safe_load(updated["retiringYaml"])
    assert set(retiring) == {"kubernetes"} and retiring["kubernetes"]["crt"].encode() == before.k8s.crt
    assert due({**news, "retiringYaml": updated["retiringYaml"]}, {"talos": "a"}) == ["kubernetes"]
    assert due({**news, "retiringYaml": updated["retiringYaml"]}, {"talos": "a", "kubernetes": "b"}) == []
    assert updated["talosconfig"] == created["talosconfig"]  # the Talos CA did not change
    talos = p.update("rot", updated, {**news, "rotate": {"talos": "c", "kubernetes": "b"}}).outs
    assert secrets.load(talos["secretsYaml"]).os != after.os and talos["talosconfig"] != updated["talosconfig"]
    assert set(yaml.safe_load(talos["retiringYaml"])) == {"talos", "kubernetes"}


def test_the_rotation_diff_prints_the_plan_and_ignores_membership(caplog):
    import logging

    from providers.ca_rotation import CaRotationProvider

    p = CaRotationProvider()
    olds = {"clusterName": "rot", "rotate": {"talos": "a"}, "done": {"talos": "a"}, "secretsYaml": "s",
            "talosconfig": "t", "retiringYaml": "", "nodes": [{"address": "127.0.48.11", "controlPlane": True}]}
    more = {**olds, "nodes": [*olds["nodes"], {"address": "127.0.48.12", "controlPlane": False}]}
    assert not p.diff("rot", olds, more).changes  # a new member alone is no rotation
    unknown = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the engine's placeholder for a value preview cannot know
    with caplog.at_level(logging.INFO):
        d = p.diff("rot", olds, {**more, "rotate": {"talos": "b"}, "secretsYaml": unknown, "retiringYaml": unknown})
    assert d.changes
    lines = [r.getMessage() for r in caplog.records if "CA rotation of rot" in r.getMessage()]
    assert len(lines) == 4 and "127.0.48.11, 127.0.48.12" in lines[0] and "drop the old CA" in lines[3]


# --- a stack made before CA rotation: its first preview keeps the zone's provider ---------------
# The zone's Kubernetes provider is replaced (and with it every object it made) when its kubeconfig
# is unknown at preview before it holds a clusterIdentifier. The kubeconfig is unknown when the
# Kubeconfig resource updates, so neither it nor the new CaRotation may show a change on a state
# recorded by older code while no rotation is due.

UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the engine's placeholder for a value preview cannot know


def _kubeconfig_state(bundle):
    from lab.controlplane import kubeconfig_text
    from kontinuum.talos import pki

    admin = pki.issue_cert(bundle.k8s, common_name="admin", organizations=["system:masters"], client=True,
                           key_type="ecdsa")
    inputs = {"address": "127.0.48.11", "talosPort": 50000, "talosconfig": "tc", "timeout": 1, "requestTimeout": 1}
    return inputs, {**inputs, "kubeconfig": kubeconfig_text("rot", "https://127.0.48.11:6443", bundle.k8s.crt, admin),
                    "endpoint": "https://127.0.48.11:6443", "kubernetesVersion": "v1"}


@pytest.mark.parametrize("recorded", ["before-renewal", "before-rotation"])
def test_a_kubeconfig_recorded_by_older_code_is_unchanged_until_the_cluster_ca_switches(recorded):
    from providers.kubeconfig import KubeconfigProvider

    p = KubeconfigProvider()
    inputs, olds = _kubeconfig_state(BUNDLE)
    if recorded == "before-rotation":  # renewal made the bundle an input; older states lack it
        olds = {**olds, "secretsYaml": secrets.dump(BUNDLE), "renewBeforeDays": 30}
    news = {**inputs, "secretsYaml": secrets.dump(BUNDLE), "renewBeforeDays": 30}
    assert not p.diff("127.0.48.11", olds, news).changes  # no update: its kubeconfig stays known at preview
    assert p.diff("127.0.48.11", olds, {**news, "secretsYaml": UNKNOWN}).changes  # TalosSecrets changes: maybe
    rotated = {**news, "secretsYaml": secrets.dump(dataclasses.replace(BUNDLE, k8s=NEW.k8s))}
    assert p.diff("127.0.48.11", olds, rotated).changes  # the Kubernetes CA switched: clients follow
    switched = p.update("127.0.48.11", olds, rotated).outs  # local: 127.0.48.11 is never dialled
    assert not p.diff("127.0.48.11", switched, rotated).changes


def test_a_rotation_created_on_a_stack_from_before_it_previews_without_changes():
    from providers.ca_rotation import CaRotationProvider

    p = CaRotationProvider()
    # TalosSecrets recorded before it had retiringYaml: the output is missing, so the SDK sends it
    # unknown at every preview and None in every up.
    props = {"clusterName": "rot", "rotate": {}, "secretsYaml": secrets.dump(BUNDLE), "talosconfig": "t",
             "retiringYaml": None, "nodes": [{"address": "127.0.48.11", "controlPlane": True}],
             "k8sEndpoint": "https://127.0.48.11:6443", "talosPort": 50000, "timeout": 1}
    created = p.create(props).outs  # nothing due: no node is dialled
    assert created["secretsYaml"] == props["secretsYaml"] and created["talosconfig"] == "t"
    assert not p.diff("rot", created, {**props, "retiringYaml": UNKNOWN}).changes
    assert not p.diff("rot", created, props).changes
    assert p.diff("rot", created, {**props, "talosconfig": UNKNOWN}).changes  # what it hands on changes


def test_tokens_first_set_on_a_zone_from_before_rotation_are_recorded_not_started():
    """The up that first gives the zone's provider its clusterIdentifier never rotates: a new CA in
    the kubeconfig while the identifier is being added would make pulumi-kubernetes replace it."""
    from providers.ca_rotation import due
    from providers.talos_secrets import TalosSecretsProvider

    p = TalosSecretsProvider()
    props = {"clusterName": "rot", "endpoints": ["127.0.48.11"], "renewBeforeDays": 30}
    made = p.create(props).outs
    old = {k: v for k, v in made.items() if k not in ("rotate", "retiringYaml")}  # as older code recorded it
    assert not p.diff("rot", old, {**props, "rotate": {}}).changes  # upgrading alone changes nothing
    news = {**props, "rotate": {"kubernetes": "b"}}
    assert p.diff("rot", old, news).changes  # the tokens are recorded...
    recorded = p.update("rot", old, news).outs
    assert recorded["secretsYaml"] == old["secretsYaml"] and recorded["retiringYaml"] == ""  # ...nothing started
    assert due({**news, "retiringYaml": recorded["retiringYaml"]}, {}) == []
    again = {**props, "rotate": {"kubernetes": "c"}}  # a later change rotates as on any zone
    rotated = p.update("rot", recorded, again).outs
    assert secrets.load(rotated["secretsYaml"]).k8s != secrets.load(old["secretsYaml"]).k8s
    assert due({**again, "retiringYaml": rotated["retiringYaml"]}, {"kubernetes": "b"}) == ["kubernetes"]


def test_the_kubernetes_check_holds_over_probes_in_a_row_before_a_phase_counts():
    """Behind a load balancer one answer can come from an apiserver already on the new chain; a
    phase counts only when the check passed three times in a row over two seconds."""
    from kontinuum.talos import rotate
    from kontinuum.talos.waits import NotYet

    now = [0.0]
    answers = iter([True, False, True, True, True, True])  # the second probe hits the old apiserver

    def probe(left: float) -> None:
        now[0] += 1.0
        if not next(answers):
            raise NotYet("refused")

    check, outcomes = rotate.held(probe, clock=lambda: now[0]), []
    for _ in range(5):
        try:
            check(10.0)
            outcomes.append("done")
        except NotYet as exc:
            outcomes.append(exc.observation)
    assert outcomes[:2] == ["it held for 1 probe(s) in a row; 3 over 2 s must pass", "refused"]
    assert outcomes[2:] == ["it held for 1 probe(s) in a row; 3 over 2 s must pass",
                            "it held for 2 probe(s) in a row; 3 over 2 s must pass", "done"]
