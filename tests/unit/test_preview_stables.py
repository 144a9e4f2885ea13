"""A preview keeps what an update cannot change (issue 31): the diffs of the resources whose
outputs feed a zone name the outputs their update keeps (DiffResult.stables), and the host's
preview update carries exactly those from the old outputs; everything else stays unknown."""

from __future__ import annotations

import dataclasses

from google.protobuf import struct_pb2

from kontinuum.talos import secrets
from providers.ca_rotation import CaRotationProvider
from providers.kubeconfig import KubeconfigProvider
from providers.previews import Stables, preview_outputs
from providers.talos_secrets import TalosSecretsProvider

UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"  # the engine's placeholder for a value preview cannot know
BUNDLE_OUTS = {"secretsYaml", "retiringYaml", "talosconfig", "talosconfigExpires", "kubernetesCa"}


def _secrets():
    p = TalosSecretsProvider()
    props = {"clusterName": "rec", "endpoints": ["127.0.68.11"], "rotate": {"talos": "a"}, "renewBeforeDays": 30}
    return p, props, p.create(props).outs


def test_a_record_only_update_of_the_bundle_keeps_every_output():
    p, props, outs = _secrets()
    for news in ({**props, "rotate": {}},  # the rotation block deleted after the rotation
                 {**props, "renewBeforeDays": 45}):  # a window moved, nothing due (no update at all)
        d = p.diff("rec", outs, news)
        if d.changes:
            assert set(d.stables) == BUNDLE_OUTS
            updated = p.update("rec", outs, news).outs
            assert {k: updated[k] for k in BUNDLE_OUTS} == {k: outs[k] for k in BUNDLE_OUTS}


def test_what_really_changes_is_not_stable():
    p, props, outs = _secrets()
    rotating = p.diff("rec", outs, {**props, "rotate": {"talos": "b"}})  # a new Talos CA and a new client cert
    assert rotating.changes and rotating.stables == ["kubernetesCa"]  # the Kubernetes CA stays: clients keep it
    k8s = p.diff("rec", outs, {**props, "rotate": {"talos": "a", "kubernetes": "b"}})
    assert set(k8s.stables) == {"talosconfig", "talosconfigExpires"}  # the bundle changes, the talosconfig not
    due = p.diff("rec", outs, {**props, "renewBeforeDays": 4000})  # the admin certificate is renewed
    assert due.changes and set(due.stables) == {"secretsYaml", "retiringYaml", "kubernetesCa"}
    moved = p.diff("rec", outs, {**props, "endpoints": ["127.0.68.12"]})  # rendered again: other endpoints
    assert set(moved.stables) == {"secretsYaml", "retiringYaml", "talosconfigExpires", "kubernetesCa"}
    unknown = p.diff("rec", outs, {**props, "endpoints": UNKNOWN})
    assert "talosconfig" not in unknown.stables


def test_the_rotation_hands_on_its_inputs_and_keeps_done_unless_a_rotation_runs():
    p = CaRotationProvider()
    olds = {"clusterName": "rec", "rotate": {"talos": "a"}, "done": {"talos": "a"}, "secretsYaml": "s",
            "talosconfig": "t", "retiringYaml": "", "nodes": []}
    cleanup = p.diff("rec", olds, {**olds, "rotate": {}})
    assert cleanup.changes and cleanup.stables == ["done"]
    assert p.update("rec", olds, {**olds, "rotate": {}}).outs["done"] == olds["done"]
    rotating = p.diff("rec", olds, {**olds, "rotate": {"talos": "b"}, "secretsYaml": UNKNOWN, "retiringYaml": UNKNOWN})
    assert rotating.changes and not rotating.stables


def test_a_kubeconfig_on_the_same_node_keeps_its_kubeconfig_unless_renewed():
    from tests.unit.test_ca_rotation import BUNDLE, NEW, _kubeconfig_state

    p = KubeconfigProvider()
    inputs, olds = _kubeconfig_state(BUNDLE)
    news = {**inputs, "secretsYaml": secrets.dump(BUNDLE), "renewBeforeDays": 30}
    olds = {**olds, "secretsYaml": news["secretsYaml"], "renewBeforeDays": 30}
    talos_only = p.diff("a", olds, {**news, "talosconfig": "renewed"})  # a new talosconfig: nothing fetched
    assert talos_only.changes and set(talos_only.stables) == {"endpoint", "kubernetesVersion", "kubeconfig",
                                                              "kubeconfigExpires"}
    rotated = p.diff("a", olds, {**news, "secretsYaml": secrets.dump(dataclasses.replace(BUNDLE, k8s=NEW.k8s))})
    assert rotated.changes and set(rotated.stables) == {"endpoint", "kubernetesVersion"}
    moved = p.diff("a", olds, {**news, "address": "127.0.68.12"})  # another node: fetched again
    assert moved.changes and not moved.stables


def _struct(d: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(d)
    return s


def test_a_preview_update_carries_exactly_the_stable_outputs():
    olds = _struct({"rotate": {"talos": "a"}, "secretsYaml": "bundle", "talosconfig": "tc", "talosconfigExpires": "x"})
    news = _struct({"rotate": {}, "secretsYaml": None, "talosconfig": UNKNOWN})
    outs = preview_outputs(olds, news, ["secretsYaml", "retiringYaml"])
    assert dict(outs) == {"rotate": struct_pb2.Struct(), "secretsYaml": "bundle", "talosconfig": UNKNOWN}
    stables = Stables()
    stables.put("urn:a", ["secretsYaml"])
    assert stables.pop("urn:a") == ["secretsYaml"] and stables.pop("urn:a") == []  # one diff, one preview update


def test_the_backup_keeps_its_key_and_its_credential_unless_reissued():
    from providers.etcd_backup import EtcdBackupProvider

    p = EtcdBackupProvider()
    props = {"cluster": "rec", "stack": "s", "destination": "/nowhere", "keep": 3, "onUp": False,
             "secretsYaml": secrets.dump(secrets.generate()), "controlPlanes": ["127.0.68.11"], "talosPort": 50000,
             "renewBeforeDays": 30}
    outs = p.create(props).outs  # no onUp: no node is asked
    window = p.diff("rec", outs, {**props, "renewBeforeDays": 45})  # recorded: the credential is not due
    assert window.changes and set(window.stables) == {"key", "backupTalosconfig", "backupTalosconfigExpires",
                                                       "lastBackup"}
    moved = p.diff("rec", outs, {**props, "controlPlanes": ["127.0.68.12"]})  # reissued for other control planes
    assert set(moved.stables) == {"key", "lastBackup"}
    unknown = p.diff("rec", outs, {**props, "secretsYaml": UNKNOWN, "onUp": True})
    assert unknown.stables == ["key"]
