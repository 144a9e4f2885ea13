"""What a platform team runs in CI (issue 20), on a lab of its own (nodes 127.0.44.11+, hub
127.0.0.44) with two region stacks in one backend:

- a region made by the Kontinuum before each provider had its own type keeps every resource
  (aliases): its first up replaces nothing and touches no node;
- `python -m kontinuum preview --all`, the command ci/ runs: Markdown and JSON per region, exit
  codes 0 / 2 / 3 / 4, a config change shown path by path with no secret of the bundle, clusters
  that stop answering bounded and named as not compared;
- drift: a node reset behind Pulumi's back shows in `pulumi refresh`, `preview --refresh
  --expect-no-changes` fails naming it, and the next up configures it again;
- `python -m kontinuum rollout`, the release job's command: three regions (a third without
  zones) in two waves, a failure in the first stops it before the second, a re-run resumes.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kontinuum.kube.clients import api_client
from kontinuum.talos import talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.secrets import load as load_secrets, secret_values
from lab.pulumi_cli import ROOT, Stack
from lab.talos_node import control
from tests.e2e import ci_rollout, cluster_lab
from tests.e2e.labs import running_lab

FIRST, HUB = "127.0.44.11", "127.0.0.44"
R1_NODE, R2_NODE, R2_WORKER = "127.0.44.11", "127.0.44.12", "127.0.44.13"
BEFORE_TYPES = "f4360bf"  # main before each provider had its own type (all were dynamic:Resource)
MUTATING = cluster_lab.MUTATING


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("ci-lab"), nodes=3, first_address=FIRST, hub_address=HUB) as state:
        yield state


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """One backend and one stacks folder for both regions, as in a repository."""
    root = tmp_path_factory.mktemp("ci")
    (root / "stacks").mkdir()
    return root


def region_config(lab: Path, region: str, zone: str, node: str, workers: list[str] | None = None) -> dict:
    z = cluster_lab.zone(zone, [node], {"web": workers} if workers else None)
    return cluster_lab.stack_config(lab, z, region)


def new_stack(place: Path, region: str, **kw) -> Stack:
    return Stack(ROOT, region, place / "state", passphrase="e2e", config_file=place / "stacks" / f"Pulumi.{region}.yaml",
                 **kw)


class OldStack(Stack):
    """A stack run by that version's own tools/pulumi (its plugins and launchers)."""

    def command(self, *args: str) -> list[str]:
        argv = super().command(*args)
        return [str(self.project_dir / "tools" / "pulumi"), *argv[1:]]


def mutating(before: dict, addresses: list[str]) -> dict:
    after = {a: control.read_state(a)["calls"] for a in addresses}
    return {a: {m: n - before[a].get(m, 0) for m, n in after[a].items()
                if n != before[a].get(m, 0) and (m in MUTATING or m.startswith("Etcd"))} for a in addresses
            if any(n != before[a].get(m, 0) and (m in MUTATING or m.startswith("Etcd")) for m, n in after[a].items())}


def calls(addresses: list[str]) -> dict:
    return {a: dict(control.read_state(a)["calls"]) for a in addresses}


def kontinuum_preview(place: Path, *args: str, env: dict | None = None, timeout: float = 600):
    """The command ci/ runs, with this test's stacks folder and backend."""
    stack = new_stack(place, "r1")
    md, js = place / "preview.md", place / "preview.json"
    for f in (md, js):
        f.unlink(missing_ok=True)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "kontinuum", "preview", *args, "--stacks-dir", str(place / "stacks"),
                        "--markdown", str(md), "--json", str(js)], cwd=ROOT, env={**stack.env(), **(env or {})},
                       capture_output=True, text=True, timeout=timeout)
    took = time.monotonic() - t0
    summary = json.loads(js.read_text()) if js.exists() else None
    return r, (md.read_text() if md.exists() else ""), summary, took


# --- 1. readable types, old stacks keep their resources ---------------------------------------


@pytest.fixture(scope="module")
def old_checkout(tmp_path_factory):
    have = subprocess.run(["git", "cat-file", "-e", f"{BEFORE_TYPES}^{{commit}}"], cwd=ROOT, capture_output=True)
    if have.returncode != 0:
        pytest.skip(f"commit {BEFORE_TYPES} is not in this clone's history (a shallow clone)")
    tree = tmp_path_factory.mktemp("before-types")
    archive = subprocess.run(["git", "archive", BEFORE_TYPES], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    (tree / "venv").symlink_to(ROOT / "venv")
    return tree


@pytest.fixture(scope="module")
def regions(lab, place, old_checkout, tools_bin):
    """r1 made by the old version, then taken over by this one; r2 made by this one."""
    r1_file = place / "stacks" / "Pulumi.r1.yaml"
    old = OldStack(old_checkout, "r1", place / "state", passphrase="e2e", config_file=r1_file,
                   extra_env={"KONTINUUM_TOOLS": str(Path(tools_bin).parent), "PYTHONPATH": str(old_checkout),
                              "PULUMI_HOME": str(place / "old-home")})
    old.init()
    old.write_config_file(region_config(lab, "r1", "a", R1_NODE))
    old.up()
    r2 = new_stack(place, "r2").init()
    r2.write_config_file(region_config(lab, "r2", "b", R2_NODE, [R2_WORKER]))
    up2 = subprocess.Popen(r2.command("up", "--yes", "--skip-preview"), cwd=ROOT, env=r2.env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield old, new_stack(place, "r1"), r2, up2
    if up2.poll() is None:
        up2.kill()


def settled(up: subprocess.Popen) -> None:
    """r2's first up, started in the background beside r1's: finished and successful."""
    if up.returncode is None:
        out, _ = up.communicate(timeout=900)
        assert up.returncode == 0, out[-3000:]


def types(stack: Stack) -> set[str]:
    return {r["type"] for r in stack.export()["deployment"]["resources"] if r["type"].startswith("pulumi-python")}


def test_a_region_made_with_the_old_type_names_keeps_every_resource(regions):
    old, r1, _, up2 = regions
    assert types(old) == {"pulumi-python:dynamic:Resource"}
    had = {r["urn"].rsplit("::", 1)[-1] for r in old.export()["deployment"]["resources"]}
    plan = json.loads(r1.preview("--json").stdout)
    bad = [(s["op"], s["urn"].rsplit("::", 1)[-1]) for s in plan.get("steps", []) if s["op"] not in ("same", "update")
           and not (s["op"] == "create" and s["urn"].rsplit("::", 1)[-1] not in had)]
    assert bad == [], bad  # no replace, no delete, nothing it had created anew: the aliases carry each over
    # The zone's provider keeps a known kubeconfig (its Kubeconfig is unchanged: the preview lists no
    # step for it; CaRotation comes in between without a change) and only gains clusterIdentifier,
    # which updates it in place.
    kind = lambda s: s["urn"].split("::")[2].rsplit("$", 1)[-1]  # noqa: E731
    assert {s["op"] for s in plan["steps"] if kind(s) == "pulumi-python:dynamic/talos:Kubeconfig"} <= {"same"}
    providers = [(s["op"], s.get("diffReasons")) for s in plan["steps"]
                 if kind(s) == "pulumi:providers:kubernetes" and "-k8s" in s["urn"]]
    assert providers == [("update", ["clusterIdentifier"])], providers
    before = calls([R1_NODE])
    r1.up()
    assert mutating(before, [R1_NODE]) == {}  # not one Talos call that changes the node
    assert "pulumi-python:dynamic:Resource" not in types(r1)
    assert {"pulumi-python:dynamic/talos:ConfigApply", "pulumi-python:dynamic/hub:Instance"} <= types(r1)
    r1.preview("--expect-no-changes")
    settled(up2)


# --- 2. preview --all --------------------------------------------------------------------------


def test_preview_all_two_regions_no_changes_then_a_config_change(regions, place):
    _, r1, r2, up2 = regions
    settled(up2)
    r, md, summary, took = kontinuum_preview(place, "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [(s["stack"], s["status"], s["cluster_compared"]) for s in summary["regions"]] == [
        ("r1", "no-changes", True), ("r2", "no-changes", True)]
    assert "### Region `r1`" in md and "### Region `r2`" in md

    original = yaml.safe_load(r1.config_file.read_text())
    changed = copy.deepcopy(original)
    changed["config"]["kontinuum:zones"][0]["patches"] = [{"machine": {"kubelet": {"extraArgs": {"max-pods": "250"}}}}]
    r1.write_config_file(changed)
    try:
        r, md, summary, _ = kontinuum_preview(place, "--all")
        diff = r1.preview("--diff").stdout
    finally:
        r1.write_config_file(original)
    assert r.returncode == 2, r.stdout + r.stderr
    s1, s2 = summary["regions"]
    assert (s1["status"], s2["status"]) == ("changes", "no-changes")
    (node,) = s1["configs_changed"]
    assert node["node"] == R1_NODE and "machine.kubelet.extraArgs.max-pods: ∅ → 250" in node["paths"]
    assert "`machine.kubelet.extraArgs.max-pods: ∅ → 250`" in md
    bundle = load_secrets(secrets_yaml(r1), check_rsa=False)
    for value in secret_values(bundle):
        assert value not in md and value not in json.dumps(summary) and value not in diff


def unready_on(kubeconfig: str, address: str, *, within: float) -> None:
    """Wait until the node lifecycle controller marked the Node at `address` Unknown and its pods
    not Ready (node-monitor-grace-period after its kubelet stopped)."""
    api = api_client(kubeconfig)
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + within
    try:
        while True:
            (node,) = [n for n in core.list_node(_request_timeout=10).items
                       if any(a.address == address for a in n.status.addresses or [])]
            ready = {c.type: c.status for c in node.status.conditions or []}.get("Ready")
            pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node.metadata.name}",
                                                    _request_timeout=10).items
            # not Ready: marked so by the controller, or replaced by a pod not yet started (no Ready condition)
            marked = [p for p in pods if {c.type: c.status for c in p.status.conditions or []}.get("Ready") != "True"]
            if ready == "Unknown" and len(marked) == len(pods):
                return
            still = sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if p not in marked)
            assert time.monotonic() < deadline, \
                f"Node {node.metadata.name}: Ready={ready}, {len(marked)}/{len(pods)} pods not Ready; Ready: {still}"
            time.sleep(2)
    finally:
        api.close()


def secrets_yaml(stack: Stack, output: str = "secretsYaml") -> str:
    deployment = json.loads(stack.run("stack", "export", "--stack", stack.name, "--show-secrets").stdout)["deployment"]
    (res,) = [r for r in deployment["resources"] if r["type"].endswith("talos:TalosSecrets")]
    value = res["outputs"][output]
    return json.loads(value["plaintext"]) if isinstance(value, dict) else value


def test_preview_bad_input_exit_codes(regions, place):
    r, _, _, _ = kontinuum_preview(place, "--stack", "nope")
    assert r.returncode == 3 and "unknown stack 'nope'" in r.stderr
    broken = place / "stacks" / "Pulumi.broken.yaml"
    broken.write_text("config:\n  kontinuum:region: [\n")
    try:
        r, md, _, _ = kontinuum_preview(place, "--all")
    finally:
        broken.unlink()
    assert r.returncode == 3 and "not valid YAML at line 3" in md
    dead = "s3://kontinuum-state?endpoint=http://127.0.44.250:9&use_path_style=true&region=us-east-1"
    r, _, _, took = kontinuum_preview(place, "--all", "--backend-timeout", "20",
                                      env={"PULUMI_BACKEND_URL": dead, "AWS_ACCESS_KEY_ID": "x",
                                           "AWS_SECRET_ACCESS_KEY": "y"})
    assert r.returncode == 4 and "state backend" in r.stderr, r.stderr
    assert took < 60


def lab_apiservers(lab: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"kube-apiserver") and any(str(lab).encode() in a for a in argv):
                pids.append(int(entry.name))
    return pids


def test_preview_with_clusters_that_stop_answering_is_bounded_and_says_so(regions, lab, place):
    """Paused API servers accept connections and never answer: worse than dropped packets."""
    settled(regions[3])
    pids = lab_apiservers(lab)
    assert len(pids) == 3  # the hub and both zones
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        r, md, summary, took = kontinuum_preview(place, "--all", "--cluster-timeout", "3")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [s["cluster_compared"] for s in summary["regions"]] == [False, False]
    assert "The cluster side was not compared" in md and "a, hub" in md
    assert took < 240, took


# --- 3. drift ----------------------------------------------------------------------------------


def test_a_node_reset_behind_pulumis_back_is_drift_that_the_next_up_repairs(regions, place):
    """An operator resets a worker with talosctl; the refresh-based drift check names it, `pulumi
    refresh` records it, and the next up configures that node again and touches no other."""
    _, _, r2, up2 = regions
    settled(up2)
    config = talosconfig.parse(secrets_yaml(r2, "talosconfig"))
    # What an operator's `talosctl reset --system-labels-to-wipe STATE --system-labels-to-wipe EPHEMERAL` does.
    TalosClient.from_talosconfig(config, node=R2_WORKER, endpoint=R2_WORKER).reset(
        graceful=False, system_partitions=("STATE", "EPHEMERAL"), timeout=30)
    deadline = time.monotonic() + 60
    while control.read_state(R2_WORKER)["mode"] != "maintenance":
        assert time.monotonic() < deadline, "the worker did not come back in maintenance mode"
        time.sleep(0.5)
    # What the cluster shows a minute later: the Node is Unknown and its pods are not Ready. The
    # repair must bring them back (it once waited 600 s on a pod no kubelet made Ready again).
    unready_on(r2.outputs(show_secrets=True)["kubeconfigs"]["b"], R2_WORKER, within=150)

    r, md, summary, _ = kontinuum_preview(place, "--stack", "r2", "--refresh", "--expect-no-changes")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"drift: b/{R2_WORKER}" in r.stderr and "maintenance mode" in md
    (node,) = summary["regions"][0]["configs_changed"]
    assert node["node"] == R2_WORKER and summary["drift"] is True

    refresh = r2.run("refresh", "--yes")
    assert f"ConfigApply {R2_WORKER}: drift: the node is in maintenance mode" in refresh.stdout + refresh.stderr
    before = calls([R2_NODE, R2_WORKER])
    r2.up()
    assert set(mutating(before, [R2_NODE, R2_WORKER])) == {R2_WORKER}  # only the reset node is configured
    assert control.read_state(R2_WORKER)["mode"] != "maintenance"
    r2.preview("--expect-no-changes")


# --- 4. a staged rollout ----------------------------------------------------------------------


def test_a_staged_rollout_stops_at_a_failure_in_its_first_wave_and_a_rerun_resumes(regions, lab, place):
    """Three regions in two waves (tests/e2e/ci_rollout.py): a failed up in the first stops it
    before the second; a dead worker in the second holds the gate; re-runs resume."""
    _, r1, r2, up2 = regions
    settled(up2)
    ci_rollout.staged_rollout(lab, place, r1, r2, new_stack(place, "r3").init(), dead_worker=R2_WORKER)
