"""A live zone survives every edit (issue 13): the HA zone (3 control planes, 2 workers) that
test_talos_cluster_engine brought up is edited one documented key at a time. For each edit:
the preview plans exactly the steps the up then makes (issue 31, tests/e2e/exact.py; the one
allowed difference is named there), the up converges, only the documented effect happens (Talos
calls counted on every lab node: no apply or reset on a node the edit does not concern) and the
next preview shows no changes. The credential keys too: certificates.renewBefore, a Talos CA
rotation token set, changed and removed (its cleanup reads "no changes to any node or release").
Membership is by machine: a spare listed for a pool joins and leaves without touching the
machines that stay, and a preview of an unrelated pool edit plans no replace.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client as kclient
from kubernetes import config as kconfig

from kontinuum.hub.inventory import Inventory
from kontinuum.naming import instance_name
from kontinuum.talos import talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.errors import PermissionDeniedError
from lab.pulumi_cli import ROOT, Stack
from tests.e2e.exact import DEFAULT_PROVIDER, compare
from tests.e2e.exact import made as made_steps
from tests.e2e.exact import planned as planned_steps
from tests.e2e.cluster_lab import (REGION, address, all_nodes, calls, delta, mutating, node_state, ready, write_config,
                                   zone)

SPARE = address(5)  # listed for the web pool beyond its replicas


def settings(stack) -> dict:
    return yaml.safe_load(stack.config_file.read_text())


def edit(stack, change) -> None:
    """Apply `change(config, zone)` to the stack's config file."""
    cfg = copy.deepcopy(settings(stack))
    change(cfg["config"], cfg["config"]["kontinuum:zones"][0])
    stack.write_config_file(cfg)


def converge(stack, *, touched: dict[str, set[str]] | None = None, allowed: dict | None = None) -> dict:
    """A preview, then `pulumi up`: the up makes exactly the steps the preview planned (issue 31;
    `allowed`: step → why it may differ), then a preview must show no changes. Returns the
    mutating Talos calls per node, after asserting that exactly `touched` (node → call names)
    were made."""
    before = calls(all_nodes())
    plan, did = compare(stack, stack.state_dir / "up-events.jsonl", allowed=allowed)
    print(f"edit: planned {sorted(plan)}; made {sorted(did)}")
    made = mutating(delta(before, calls(all_nodes())))
    assert {a: set(c) for a, c in made.items()} == (touched or {}), made
    stack.preview("--expect-no-changes")
    assert ready(stack, "ha")
    return made


def planned(stack) -> list[tuple[str, str, str]]:
    """(op, kind, name) of every step a preview plans other than `same`; kind tells a machine's
    Instance ("instance", a Zone child) from its ConfigApply ("member", a TalosCluster child),
    which share the machine's name."""
    out = json.loads(stack.preview("--json").stdout)
    steps = []
    for s in out.get("steps", []):
        if s["op"] == "same":
            continue
        qualified, name = s["urn"].rsplit("::", 2)[-2:]
        kind = {"pulumi-python:dynamic/talos:ConfigApply": "member", "pulumi-python:dynamic/hub:Instance": "instance"
                }.get(qualified.rsplit("$", 1)[-1], qualified.rsplit("$", 1)[-1])
        steps.append((s["op"], kind, name))
    return steps


def machine(a: str) -> str:
    return instance_name(REGION, "ha", a)


def web(z: dict) -> dict:
    return next(p for p in z["workers"] if p["name"] == "web")


def people(stack, kind: str, tmp_path, *args: str) -> Path:
    out = tmp_path / kind
    made = subprocess.run([sys.executable, "-m", "kontinuum", kind, "--stack", stack.name, "--zone", "ha", "-o", str(out),
                           *args], cwd=ROOT, env=stack.env(), capture_output=True, text=True, timeout=120)
    assert made.returncode == 0 and "expires" in made.stderr, made.stderr
    assert out.stat().st_mode & 0o777 == 0o600
    return out


def test_credentials_for_people_carry_only_their_role_and_group(zone_stack, tmp_path):
    """A reader talosconfig reads and may not reset; a view kubeconfig lists and may not write."""
    stack, _ = zone_stack
    cp = address(0)
    reader = talosconfig.parse(people(stack, "talosconfig", tmp_path, "--ttl", "1h").read_text())
    assert reader.context == "reader@e2e-ha"
    client_ = TalosClient.from_talosconfig(reader, node=cp, endpoint=cp)
    assert client_.version().tag.startswith("v1.13")
    seen = len(node_state(cp)["events"])
    with pytest.raises(PermissionDeniedError):
        client_.reset(graceful=True, reboot=True)  # refused: the node neither resets nor reboots
    assert node_state(cp)["mode"] == "configured"
    assert not [e for e in node_state(cp)["events"][seen:] if e["event"] in ("reboot", "reset")]
    api = kconfig.new_client_from_config(str(people(stack, "kubeconfig", tmp_path, "--user", "ada")))
    try:
        core = kclient.CoreV1Api(api)
        assert core.list_namespaced_pod("kube-system", _request_timeout=10).items
        with pytest.raises(kclient.ApiException) as refused:
            core.create_namespaced_config_map("default", {"metadata": {"name": "ada-was-here"}}, _request_timeout=10)
        assert refused.value.status == 403
    finally:
        api.close()


def test_timeouts_of_discovery_and_claim_touch_no_node_and_preview_no_replace(zone_stack):
    stack, _ = zone_stack
    edit(stack, lambda c, z: z.setdefault("timeouts", {}).update({"discovery": 6, "claim": 3}))
    steps = planned(stack)
    # Only the Instances and the pools change: no machine's ConfigApply, no provider, no CRD.
    pools = {"e2e-ha-controlplane", "e2e-ha-web"}
    assert steps and all(op == "update" and (kind == "instance" or name in pools) for op, kind, name in steps), steps
    before = calls(all_nodes())
    converge(stack)
    assert {a: c for a, c in delta(before, calls(all_nodes())).items() if c} == {}  # not even a probe


def test_health_timeout_reruns_the_check_with_the_workers_that_joined(zone_stack):
    stack, _ = zone_stack
    edit(stack, lambda c, z: z["timeouts"].update({"health": 91}))
    converge(stack)


def test_hub_side_edits_touch_no_node(zone_stack, tmp_path):
    """A rotated hub kubeconfig and unregisterInstancesOnDelete turned on, in one up."""
    stack, lab = zone_stack
    rotated = tmp_path / "hub-kubeconfig"
    rotated.write_text("# rotated\n" + (lab / "hub" / "kubeconfig").read_text())

    def change(c, z):
        c["kontinuum:hubKubeconfigFile"] = str(rotated)
        z["unregisterInstancesOnDelete"] = True
    edit(stack, change)
    converge(stack)


# --- credentials: each preview plans exactly what its up does (issue 31) ---------------------------

SECRETS, ROTATION = "talos:TalosSecrets::e2e-ha-secrets", "talos:CaRotation::e2e-ha-ca-rotation"


def certificates(change) -> callable:
    return lambda c, z: change(z.setdefault("certificates", {}))


def test_renewal_window_moved_previews_and_changes_nothing(zone_stack, tmp_path):
    stack, _ = zone_stack
    edit(stack, certificates(lambda cert: cert.update({"renewBefore": 45})))
    before = calls(all_nodes())
    plan, _ = compare(stack, tmp_path / "up.jsonl")
    # No certificate is due within 45 days: nothing is renewed; the backup records the window its
    # credential is renewed within (its key and credential stay known: nothing downstream changes).
    assert plan == {("update", "pulumi-python:dynamic/etcd:EtcdBackup::e2e-ha-etcd-backup")}, plan
    assert mutating(delta(before, calls(all_nodes()))) == {}


def test_rotation_tokens_set_changed_and_removed_preview_exactly_their_up(zone_stack, tmp_path):
    """A Talos token set rotates the Talos API CA, changed rotates it again, and the block deleted
    afterwards is a cleanup: each preview plans exactly what its up does. A rotation changes the
    machine configs (a new CA in them, unknown until apply) and the talosconfig, never the admin
    kubeconfig: the zone's Kubernetes provider, its objects and releases stay as they are."""
    stack, _ = zone_stack
    for token in ("e2e-1", "e2e-2"):
        edit(stack, certificates(lambda cert: cert.update({"rotate": {"talos": token}})))
        md = kontinuum_preview(stack, tmp_path)
        assert "CA rotation of the Talos API CA (certificates.rotate.talos: " in md and "kubeconfig" not in md, md
        assert md.count("unknown until apply: the machine config is rendered from the secrets bundle") == 5, md
        plan, _ = compare(stack, tmp_path / f"{token}.jsonl")
        assert ("update", "pulumi-python:dynamic/talos:ConfigApply::" + machine(address(0))) in plan, plan
        assert not [k for _, k in plan if k.startswith(("kubernetes:", "pulumi:providers:kubernetes"))], plan
        stack.preview("--expect-no-changes")
    # The rotation block deleted once it finished: both resources record it; no node, no release, no
    # certificate, no Kubernetes object changes, and the preview says so.
    edit(stack, certificates(lambda cert: cert.pop("rotate")))
    md = kontinuum_preview(stack, tmp_path)
    assert "no changes to any node or release" in md and "renew" not in md, md
    before = calls(all_nodes())
    plan, _ = compare(stack, tmp_path / "cleanup.jsonl")
    assert plan == {("update", f"pulumi-python:dynamic/{SECRETS}"), ("update", f"pulumi-python:dynamic/{ROTATION}")}, plan
    assert mutating(delta(before, calls(all_nodes()))) == {}
    stack.preview("--expect-no-changes")


def test_a_due_renewal_previews_its_certificates_and_names_what_is_unknown(zone_stack, tmp_path):
    """renewBefore beyond the certificates' year: both admin certificates are renewed, locally. The
    renewed kubeconfig is known only once the up issues it, so the engine plans every object on the
    zone's Kubernetes provider as possibly changing; the up changes none of them, and the summary
    says "unknown until apply" and why instead of claiming a change. Everything else is exact."""
    stack, _ = zone_stack
    edit(stack, certificates(lambda cert: cert.update({"renewBefore": 400})))
    md = kontinuum_preview(stack, tmp_path)
    assert "admin talosconfig renewed" in md and "admin kubeconfig renewed" in md, md
    assert "objects on the zone's Kubernetes provider: unknown until apply: its kubeconfig is renewed " \
           "(certificates.renewBefore)" in md, md
    before = calls(all_nodes())
    plan = planned_steps(stack)
    did = made_steps(stack, tmp_path / "renewal.jsonl")
    assert did - plan <= {DEFAULT_PROVIDER}, sorted(did - plan)
    assert plan - did and all(k.startswith("kubernetes:") for _, k in plan - did), sorted(plan - did)
    assert {("update", f"pulumi-python:dynamic/{SECRETS}"), ("update", "pulumi-python:dynamic/talos:Kubeconfig::"
            "e2e-ha-kubeconfig")} <= did, sorted(did)
    assert mutating(delta(before, calls(all_nodes()))) == {}  # renewed locally: no node is asked
    edit(stack, lambda c, z: z.pop("certificates"))  # back to the default window: nothing due, nothing to do
    converge(stack)


def kontinuum_preview(stack, tmp_path) -> str:
    """`python -m kontinuum preview` of this stack (its config file in a stacks folder of its own)."""
    stacks = tmp_path / "stacks"
    stacks.mkdir(exist_ok=True)
    shutil.copy(stack.config_file, stacks / f"Pulumi.{stack.name}.yaml")
    md = tmp_path / "preview.md"
    r = subprocess.run([sys.executable, "-m", "kontinuum", "preview", "--stack", stack.name, "--stacks-dir", str(stacks),
                        "--markdown", str(md)], cwd=ROOT, env=stack.env(), capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 2), r.stderr
    return md.read_text()


def test_cluster_patch_reapplies_every_node_once_and_resets_none(zone_stack):
    stack, _ = zone_stack
    patch = [{"op": "add", "path": "/machine/sysctls", "value": {"net.core.somaxconn": "65535"}}]
    edit(stack, lambda c, z: z.update({"patches": [patch]}))
    made = converge(stack, touched={a: {"ApplyConfiguration"} for a in address_range(0, 5)})
    assert all(c == {"ApplyConfiguration": 1} for c in made.values()), made


def address_range(first: int, end: int) -> list[str]:
    return [address(i) for i in range(first, end)]


def test_addon_values_and_server_image_touch_no_node(zone_stack):
    stack, _ = zone_stack

    def change(c, z):
        z.setdefault("addons", {}).setdefault("cilium", {})["values"] = {"e2eEdit": "yes"}
        z["serverImage"] = "ghcr.io/kontinuum-sh/kontinuum-server:e2e-edit"
    edit(stack, change)
    converge(stack)


def test_spare_joins_and_leaves_alone_with_replicas(zone_stack):
    stack, _ = zone_stack
    edit(stack, lambda c, z: z["talosAddresses"].append({"address": SPARE, "pool": "web"}))
    converge(stack)  # listed beyond replicas: a spare, registered and discovered, not configured
    assert node_state(SPARE)["mode"] == "maintenance"
    edit(stack, lambda c, z: web(z).update({"replicas": 3}))
    steps = planned(stack)
    assert ("create", "member", machine(SPARE)) in steps
    assert not [s for s in steps if s[0] not in ("create", "update")], steps
    assert not [s for s in steps if s[1] == "member" and s[2] != machine(SPARE)], steps
    converge(stack, touched={SPARE: {"ApplyConfiguration"}})
    assert node_state(SPARE)["mode"] == "configured"
    edit(stack, lambda c, z: web(z).update({"replicas": 2}))
    converge(stack, touched={SPARE: {"Reset"}})  # the spare leaves; the two workers that stay are untouched
    assert node_state(SPARE)["mode"] == "maintenance"


def test_removing_a_machine_resets_exactly_that_machine(zone_stack):
    stack, _ = zone_stack
    gone = address(3)  # the first web worker: the spare moves into the pool in its place

    def change(c, z):
        z["talosAddresses"] = [m for m in z["talosAddresses"] if m["address"] != gone]
    edit(stack, change)
    steps = planned(stack)
    assert ("delete", "member", machine(gone)) in steps and ("create", "member", machine(SPARE)) in steps
    assert not [s for s in steps if s[0] in ("replace", "create-replacement", "delete-replaced")], steps
    assert not [s for s in steps if s[1] == "member" and s[2] not in (machine(gone), machine(SPARE))], steps
    converge(stack, touched={gone: {"Reset"}, SPARE: {"ApplyConfiguration"}})
    assert node_state(gone)["mode"] == "maintenance" and node_state(address(4))["mode"] == "configured"
    # Issue 27: the host-network Gateway's addresses and the DNS records follow: the spare, not the one that left.
    out = stack.outputs()["zones"]["ha"]
    assert [SPARE in a and gone not in a for a in (out["addresses"], [r.split()[-1] for r in out["dns"]["records"]])
            ] == [True, True], out


def test_instance_deleted_out_of_band_then_an_unrelated_edit_resets_nothing(zone_stack):
    stack, lab = zone_stack
    inv = Inventory.from_kubeconfig((lab / "hub" / "kubeconfig").read_text())
    first_worker = machine(address(4))
    assert inv.unregister(first_worker)
    edit(stack, lambda c, z: z["timeouts"].update({"claim": 4}))
    converge(stack)  # the pool registers the member again; no machine moves, none is reset
    assert inv.get(first_worker) is not None
    assert all(node_state(a)["mode"] == "configured" for a in (*address_range(0, 3), address(4), SPARE))


def test_swapping_every_control_plane_is_refused_at_preview(zone_stack):
    stack, _ = zone_stack
    before = calls(all_nodes())
    original = settings(stack)

    def change(c, z):
        z["talosAddresses"] = [m for m in z["talosAddresses"] if m.get("pool", "controlplane") != "controlplane"] + [
            {"address": address(6), "pool": "controlplane"}]
        z["controlPlane"]["replicas"] = 1
    edit(stack, change)
    result = stack.run("preview", check=False)
    assert result.returncode != 0
    assert "every member would change at once" in result.stdout + result.stderr
    assert mutating(delta(before, calls(all_nodes()))) == {}
    stack.write_config_file(original)
    stack.preview("--expect-no-changes")


# --- a stack made by the Kontinuum before members were keyed by machine ---------------------------

BEFORE_IDENTITIES = "e6c4271"  # main before this change: one ConfigApply per pool slot
OLD_CP, OLD_WORKER = address(7), address(8)


@pytest.fixture(scope="module")
def old_checkout(tmp_path_factory):
    """That version's tree (git archive), run with this checkout's venv and tools."""
    have = subprocess.run(["git", "cat-file", "-e", f"{BEFORE_IDENTITIES}^{{commit}}"], cwd=ROOT, capture_output=True)
    if have.returncode != 0:
        pytest.skip(f"commit {BEFORE_IDENTITIES} is not in this clone's history (a shallow clone)")
    tree = tmp_path_factory.mktemp("before-identities")
    archive = subprocess.run(["git", "archive", BEFORE_IDENTITIES], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    (tree / "venv").symlink_to(ROOT / "venv")
    return tree


class OldStack(Stack):
    """A stack run by that version's own tools/pulumi (and so its plugins and launchers)."""

    def command(self, *args: str) -> list[str]:
        argv = super().command(*args)
        return [str(self.project_dir / "tools" / "pulumi"), *argv[1:]]


def test_a_stack_made_before_identities_moves_without_touching_a_node(cluster_lab, old_checkout, tmp_path):
    z = zone("old", [OLD_CP], {"web": [OLD_WORKER]})
    tools = Path(subprocess.run([str(ROOT / "tools" / "install.sh"), "--print-bin"], capture_output=True, text=True,
                                check=True).stdout.strip()).parent
    old = OldStack(old_checkout, "old", tmp_path / "state", passphrase="e2e", config_file=tmp_path / "Pulumi.old.yaml",
                   extra_env={"KONTINUUM_TOOLS": str(tools), "PYTHONPATH": str(old_checkout),
                              "PULUMI_HOME": str(tmp_path / "old-home")})
    old.init()
    shutil.rmtree(tmp_path / "old-home" / "plugins", ignore_errors=True)  # that version's launchers, from PATH
    write_config(old, cluster_lab, z)
    old.up()
    slots = [r["urn"].rsplit("::", 1)[-1] for r in old.export()["deployment"]["resources"] if "-web-0" in r["urn"]
             or "-controlplane-0" in r["urn"]]
    assert sorted(slots) == ["e2e-old-controlplane-0", "e2e-old-web-0"]

    new = Stack(ROOT, "old", tmp_path / "state", passphrase="e2e", config_file=tmp_path / "Pulumi.old.yaml")
    subprocess.run([str(ROOT / "venv" / "bin" / "python"), "-m", "kontinuum", "migrate", "--stack", "old"],
                   cwd=ROOT, env=new.env(), check=True, capture_output=True, text=True)
    steps = json.loads(new.preview("--json").stdout).get("steps", [])
    bad = [(s["op"], s["urn"].rsplit("::", 1)[-1]) for s in steps if s["op"] not in ("same", "update", "create")
           or (s["op"] == "create" and re.search(r"-[0-9a-f]{8}$", s["urn"]))]
    assert bad == [], bad  # no replace, no delete, no new machine resource: the same machines, new names
    before = calls([OLD_CP, OLD_WORKER])
    new.up()
    assert mutating(delta(before, calls([OLD_CP, OLD_WORKER]))) == {}
    new.preview("--expect-no-changes")
    assert ready(new, "old")
    new.destroy()
    assert node_state(OLD_CP)["mode"] == "maintenance" and node_state(OLD_WORKER)["mode"] == "maintenance"
