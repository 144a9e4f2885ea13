"""The region preview summary (issue 20): what a plan means, path-precise config diffs with
every secret of the bundle masked, and the CLI's exit codes for bad input without an engine."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from kontinuum.preview_summary import markdown, summarize
from kontinuum.talos import config_view, machineconfig as mc, secrets
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec

FIXTURE = Path(__file__).parent / "fixtures" / "talosctl-secrets.yaml"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
BASE = "urn:pulumi:eu::kontinuum::kontinuum:index:Zone$kontinuum:index:TalosCluster$"


@pytest.fixture(scope="module")
def bundle() -> secrets.SecretsBundle:
    return secrets.load(FIXTURE.read_text())


def render(bundle, **patch) -> str:
    spec = ClusterSpec(name="eu-1a", endpoint="https://10.0.0.5:6443", kubernetes_version="1.34.1",
                       control_plane=PoolSpec(CONTROLPLANE, 1), workers=(), **patch)
    return mc.render(spec, bundle, pool="controlplane").decode()


def step(op: str, rtype: str, name: str, old: dict | None = None, new: dict | None = None,
         parent: str = BASE) -> dict:
    s = {"op": op, "urn": f"{parent}{rtype}::{name}"}
    if old is not None:
        s["oldState"] = {"inputs": old, "outputs": old}
    if new is not None:
        s["newState"] = {"inputs": new}
    return s


def test_the_view_masks_every_secret_of_the_bundle_and_shows_a_rotation(bundle):
    text = render(bundle)
    view = config_view.view(text, bundle)
    shown = json.dumps(view)
    for value in secrets.secret_values(bundle):
        assert value not in shown
    assert view["cluster.secretboxEncryptionSecret"].startswith("[secret ")
    assert view["machine.install.image"] == "ghcr.io/siderolabs/installer:v1.13.0"
    rotated = secrets.generate()
    other = config_view.view(render(rotated), bundle)  # same key, other secret: another tag
    assert other["cluster.secretboxEncryptionSecret"] != view["cluster.secretboxEncryptionSecret"]
    assert other["cluster.secretboxEncryptionSecret"].startswith("[secret ")


def test_a_patch_adding_a_secret_by_value_is_masked_too(bundle):
    text = render(bundle) + "---\napiVersion: v1alpha1\nkind: ExtraThing\nname: x\nnote: " + \
        bundle.bootstrap_token + "\n"
    view = config_view.view(text, bundle)
    assert view["ExtraThing[x].note"].startswith("[secret ")
    assert bundle.bootstrap_token not in json.dumps(view)


def test_summary_names_zones_nodes_config_paths_and_upgrades(bundle):
    old_view = config_view.view(render(bundle), bundle)
    new_view = {**old_view, "machine.kubelet.extraArgs.max-pods": "250",
                "machine.install.image": "ghcr.io/siderolabs/installer:v1.13.1",
                "cluster.secretboxEncryptionSecret": "[secret 00000000]"}
    node = {"address": "10.0.0.5", "pool": "controlplane", "configView": old_view, "applyTimeout": 600,
            "config": "[secret]"}
    plan = {"changeSummary": {"same": 10, "update": 1, "create": 3, "delete": 2},
            "steps": [
                step("update", "pulumi-python:dynamic/talos:ConfigApply", "eu-a-0a1b2c3d", node,
                     {**node, "configView": new_view, "applyTimeout": 900}),
                step("create", "kontinuum:index:Zone", "eu-b", parent="urn:pulumi:eu::kontinuum::"),
                step("create", "pulumi-python:dynamic/talos:ConfigApply", "eu-b-11112222", None,
                     {"address": "10.0.1.11", "pool": "controlplane"}),
                step("delete", "kontinuum:index:Zone", "eu-c", {}, None, parent="urn:pulumi:eu::kontinuum::"),
                step("delete", "pulumi-python:dynamic/talos:ConfigApply", "eu-c-33334444",
                     {"address": "10.0.2.11", "pool": "general"}),
                step("update", "pulumi-python:dynamic/talos:Kubeconfig", "eu-a-kubeconfig",
                     {"address": "10.0.0.5", "kubeconfigExpires": "2026-01-10T00:00:00Z"},
                     {"address": "10.0.0.5", "renewBeforeDays": 30}),
            ]}
    s = summarize("eu", plan, region="eu", zones=["a", "b"], now=NOW)
    assert (s.zones_added, s.zones_removed, s.zones_changed) == (["b"], ["c"], ["a"])
    assert [(n.zone, n.node) for n in s.nodes_reset] == [("c", "10.0.2.11")]
    assert [(n.zone, n.node) for n in s.nodes_joining] == [("b", "10.0.1.11")]
    (changed,) = s.configs_changed
    assert "machine.kubelet.extraArgs.max-pods: ∅ → 250" in changed.paths
    assert "applyTimeout: 600 → 900" in changed.paths
    assert any(p.startswith("cluster.secretboxEncryptionSecret: [secret ") and p.endswith("→ [secret 00000000]")
               for p in changed.paths)
    assert s.upgrades == ["a 10.0.0.5 (controlplane): machine.install.image: ghcr.io/siderolabs/installer:v1.13.0"
                          " → ghcr.io/siderolabs/installer:v1.13.1"]
    assert s.certificates == ["a: eu-a-kubeconfig (admin kubeconfig renewed: its certificate expires "
                              "2026-01-10T00:00:00Z, within certificates.renewBefore (30 days))"]
    text = markdown(s)
    assert "Nodes to be reset" in text and "10.0.2.11" in text and s.status == "changes"
    for value in secrets.secret_values(bundle):
        assert value not in text


def test_no_changes(bundle):
    s = summarize("eu", {"changeSummary": {"same": 38}, "steps": []}, region="eu", zones=["eu-1a"])
    assert s.status == "no-changes" and "no changes" in markdown(s)


def test_bad_input_exits_3_before_any_engine_or_backend(tmp_path, capsys, monkeypatch):
    from kontinuum import preview_runner
    from kontinuum.__main__ import main

    monkeypatch.setattr(preview_runner, "list_stacks", lambda **kw: pytest.fail("the backend was asked"))
    (tmp_path / "Pulumi.broken.yaml").write_text("config:\n  kontinuum:region: [\n")
    (tmp_path / "Pulumi.typo.yaml").write_text("config:\n  kontinuum:regoin: eu\n")
    assert main(["preview", "--stack", "nope", "--stacks-dir", str(tmp_path)]) == 3
    assert "unknown stack 'nope'" in capsys.readouterr().err
    out = tmp_path / "s.json"
    assert main(["preview", "--all", "--stacks-dir", str(tmp_path), "--json", str(out)]) == 3
    text = capsys.readouterr().out
    assert "not valid YAML at line 3" in text and "regoin" in text
    assert {s["stack"]: s["status"] for s in json.loads(out.read_text())["regions"]} == {
        "broken": "invalid", "typo": "invalid"}


def test_addon_helm_values_diff_by_path_and_secret_values_stay_masked():
    old = {"values": {"operator": {"replicas": 1}, "hubble": {"enabled": False}, "token": "[secret]"}}
    new = {"values": {"operator": {"replicas": 2}, "hubble": {"enabled": False}, "token": "[secret]",
                      "extra": ["a"]}}
    plan = {"changeSummary": {"update": 1}, "steps": [step("update", "kubernetes:helm.sh/v3:Release", "eu-a-cilium",
                                                            old, new)]}
    s = summarize("eu", plan, region="eu", zones=["a"])
    assert s.addon_values == ["a eu-a-cilium: extra[0]: ∅ → a", "a eu-a-cilium: operator.replicas: 1 → 2"]


def test_the_summary_lists_the_reboots_a_config_change_makes_in_their_order():
    plan_lines = ["wave 1: reboot cp-1 (10.0.0.1)", "wave 2: reboot w-1 (10.0.1.1)", "live, no reboot: cp-2"]
    plan = {"changeSummary": {"update": 1}, "steps": [
        step("update", "pulumi-python:dynamic/talos:ConfigRollout", "eu-a-config-rollout", {"plan": []},
             {"plan": plan_lines})]}
    s = summarize("eu", plan, region="eu", zones=["a"])
    assert s.reboots == [f"a: {line}" for line in plan_lines]
    text = markdown(s)
    assert text.index("Reboots planned, in this order") < text.index("wave 1: reboot cp-1")


# --- credentials (issue 31): no renewal, config change or release change the up would not make ---

SECRETS, ROTATION = "pulumi-python:dynamic/talos:TalosSecrets", "pulumi-python:dynamic/talos:CaRotation"
RECORDED = {"rotate": {"talos": "2026-12"}, "renewBeforeDays": 30, "talosconfigExpires": "2027-01-01T00:00:00Z"}


def test_a_rotation_token_cleanup_reads_no_changes_to_any_node_or_release():
    plan = {"changeSummary": {"same": 79, "update": 2},
            "steps": [step("update", SECRETS, "eu-a-secrets", RECORDED, {**RECORDED, "rotate": {}}),
                      step("update", ROTATION, "eu-a-ca-rotation", {"rotate": {"talos": "2026-12"}}, {"rotate": {}})]}
    s = summarize("eu", plan, region="eu", zones=["a"], now=NOW)
    assert s.certificates == [] and s.configs_changed == [] and s.addon_values == []
    text = markdown(s)
    assert "no changes to any node or release" in text and "renew" not in text, text


def test_a_rotation_names_itself_and_what_is_unknown_until_apply():
    node = {"address": "10.0.0.5", "pool": "controlplane", "configView": {"machine.ca.crt": "x"}}
    unknown = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
    plan = {"changeSummary": {"update": 5},
            "steps": [step("update", SECRETS, "eu-a-secrets", RECORDED, {**RECORDED, "rotate": {"talos": "2027-01"}}),
                      step("update", "pulumi-python:dynamic/talos:ConfigApply", "eu-a-0a1b2c3d", node,
                           {**node, "configView": unknown}),
                      step("update", "pulumi-python:dynamic/talos:Kubeconfig", "eu-a-kubeconfig",
                           {"address": "10.0.0.5", "kubeconfigExpires": "2027-01-01T00:00:00Z"},
                           {"address": "10.0.0.5", "renewBeforeDays": 30}),
                      step("update", "kubernetes:helm.sh/v3:Release", "eu-a-cilium", {"values": {"a": 1}},
                           {"values": {"a": 1}}),
                      step("update", "pulumi-python:dynamic/talos:ConfigRollout", "eu-a-config-rollout", {},
                           {"plan": ["unknown until apply: the machine config of pool controlplane (computed in the up)"]})]}
    kubernetes = {"rotate": {"talos": "2027-01", "kubernetes": "2027-01"}}
    reissued = {"changeSummary": {"update": 4},
                "steps": [step("update", SECRETS, "eu-a-secrets", {**RECORDED, "rotate": {"talos": "2027-01"}},
                               {**RECORDED, **kubernetes}),
                          step("update", "pulumi-python:dynamic/talos:Kubeconfig", "eu-a-kubeconfig",
                               {"address": "10.0.0.5"}, {"address": "10.0.0.5"}),
                          step("update", "kubernetes:cert-manager.io/v1:Certificate", "eu-a-certificate", {}, {}),
                          step("update", "kubernetes:core/v1:Namespace", "eu-a-namespace", {}, {})]}
    r = summarize("eu", reissued, region="eu", zones=["a"], now=NOW)
    assert r.certificates[1:] == ["a: eu-a-kubeconfig (re-issued from the new Kubernetes CA "
                                  "(certificates.rotate.kubernetes))"]  # the Certificate object is not renewed
    assert r.objects == ["a: 2 objects on the zone's Kubernetes provider: unknown until apply: its kubeconfig is "
                         "re-issued from the new Kubernetes CA (certificates.rotate.kubernetes), so the engine cannot "
                         "compare them at preview (eu-a-certificate, eu-a-namespace)"]
    s = summarize("eu", plan, region="eu", zones=["a"], now=NOW)
    assert s.certificates == ["a: CA rotation of the Talos API CA (certificates.rotate.talos: 2026-12 → 2027-01): "
                              "every node, one at a time, no reboot; accept, swap, clients switched, old CA dropped"]
    (node_change,) = s.configs_changed
    assert node_change.why == ("unknown until apply: the machine config is rendered from the secrets bundle, which "
                               "the CA rotation changes (certificates.rotate.talos)")
    assert s.addon_values == ["a eu-a-cilium: unknown until apply: an input of the release (or its Kubernetes "
                              "provider's config) is not known at preview"]
    assert s.reboots == ["a: unknown until apply: the machine config of pool controlplane (computed in the up); the "
                         "secrets bundle they are rendered from changes with the CA rotation (certificates.rotate.talos)"]
    assert "no changes to any node or release" not in markdown(s)


def test_a_due_talosconfig_renewal_is_claimed_and_a_window_not_due_is_not():
    due = {**RECORDED, "talosconfigExpires": "2026-01-20T00:00:00Z"}
    plan = {"changeSummary": {"update": 1}, "steps": [step("update", SECRETS, "eu-a-secrets", due, due)]}
    assert summarize("eu", plan, region="eu", zones=["a"], now=NOW).certificates == [
        "a: admin talosconfig renewed: its certificate expires 2026-01-20T00:00:00Z, within certificates.renewBefore "
        "(30 days)"]
    plan["steps"] = [step("update", SECRETS, "eu-a-secrets", RECORDED, {**RECORDED, "renewBeforeDays": 45})]
    assert summarize("eu", plan, region="eu", zones=["a"], now=NOW).certificates == []
