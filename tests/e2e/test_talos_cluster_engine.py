"""TalosCluster under the real engine (issue 7): the repo's own program on an embedded lab.

One lab for the module (lab.supervisor through `python -m lab up`, its own state folder, nodes
127.0.33.11+, hub 127.0.0.33). Every test runs the main program (repo root) with its own stack,
whose config file lives in tmp (Stack.config_file), never in the repo's stacks/. Assertions
are on what an operator sees: stack outputs, the engine's event log, the nodes' call counters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lab.pulumi_cli import ROOT, Stack, kill_strays
from lab.talos_node import control
from tests.e2e.labs import running_lab

FIRST_ADDRESS = "127.0.33.11"
HUB_ADDRESS = "127.0.0.33"
NODES = 11  # one (1) + ha (5) + kill (1) + hang (2) + spares
REGION = "e2e"
MUTATING = ("ApplyConfiguration", "Bootstrap", "Reset", "Upgrade")  # and every Etcd* call

# Short bounds: a failure is quick and says which wait ran out.
TIMEOUTS = {"discovery": 5, "apply": 45, "bootstrap": 45, "kubeconfig": 60, "cilium": 90, "health": 90,
            "certManager": 90, "certificate": 60, "registryJoin": 60, "teardown": 30}


def address(i: int) -> str:
    a, b, c, d = FIRST_ADDRESS.split(".")
    return f"{a}.{b}.{c}.{int(d) + i}"


ONE = [address(0)]
HA_CPS, HA_WORKERS = [address(1), address(2), address(3)], [address(4), address(5)]
KILL = [address(6)]
HANG_CP, HANG_WORKER = address(7), address(8)


# --- the lab and its nodes --------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab"), nodes=NODES, first_address=FIRST_ADDRESS,
                     hub_address=HUB_ADDRESS) as state:
        yield state


node_state = control.read_state
set_faults = control.set_faults


def calls(addresses: list[str]) -> dict[str, dict[str, int]]:
    return {a: dict(node_state(a)["calls"]) for a in addresses}


def delta(before: dict, after: dict) -> dict[str, dict[str, int]]:
    return {a: {m: n - before[a].get(m, 0) for m, n in after[a].items() if n != before[a].get(m, 0)} for a in after}


def mutating(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out = {a: {m: n for m, n in c.items() if m in MUTATING or m.startswith("Etcd")} for a, c in counts.items()}
    return {a: c for a, c in out.items() if c}


def all_nodes() -> list[str]:
    return [address(i) for i in range(NODES)]


# --- stacks -----------------------------------------------------------------------------------


def zone(name: str, cps: list[str], workers: dict[str, list[str]] | None = None, *, endpoint: str | None = None,
         labels: dict[str, dict] | None = None, timeouts: dict | None = None) -> dict:
    machines = [{"address": a, "pool": "controlplane"} for a in cps]
    pools = []
    for pool, addrs in (workers or {}).items():
        machines += [{"address": a, "pool": pool} for a in addrs]
        pools.append({"name": pool, "replicas": len(addrs), "nodeLabels": (labels or {}).get(pool, {})})
    z = {"zone": name, "talosAddresses": machines, "controlPlane": {"replicas": len(cps)}, "workers": pools}
    if endpoint:
        z["controlPlane"]["endpoint"] = endpoint
    if timeouts:
        z["timeouts"] = timeouts
    return z


def write_config(stack: Stack, lab_state: Path, z: dict) -> None:
    stack.write_config_file({"config": {
        "kontinuum:region": REGION,
        "kontinuum:hubKubeconfigFile": str(lab_state / "hub" / "kubeconfig"),
        "kontinuum:hub": {"dnsDomain": "kontinuum.test", "grpcEndpoint": "hub.kontinuum.test:443",
                          "acme": {"email": "ops@kontinuum.test", "server": "https://acme.kontinuum.test/directory"},
                          "auth": {"mode": "anonymous"}},
        "kontinuum:defaults": {
            "serverImage": "ghcr.io/kontinuum-sh/kontinuum-server:lab",
            "addons": {"cilium": {"chart": {"path": str(ROOT / "lab" / "charts" / "cilium")}},
                       "certManager": {"chart": {"path": str(ROOT / "lab" / "charts" / "cert-manager")}},
                       "gatewayApi": {"source": str(ROOT / "lab" / "crds" / "gateway-api")}},
            "timeouts": TIMEOUTS,
        },
        "kontinuum:zones": [z],
    }})


def new_stack(tmp: Path, lab_state: Path, z: dict) -> Stack:
    stack = Stack(ROOT, z["zone"], tmp / f"{z['zone']}-state", passphrase="e2e",
                  config_file=tmp / f"Pulumi.{z['zone']}.yaml",
                  extra_env={"PULUMI_DEBUG_COMMANDS": "true"}).init()  # the engine's --event-log needs it
    write_config(stack, lab_state, z)
    return stack


def ready(stack: Stack, name: str) -> bool:
    return stack.outputs()["zones"][name]["ready"] is True


def events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line the engine is still writing
    return out


def seq(evs: list[dict], kind: str, urn_suffix: str) -> int:
    """Sequence number of the first `kind` event (resourcePreEvent: started, resOutputsEvent:
    finished) of the resource whose URN ends with ::<urn_suffix>."""
    for e in evs:
        meta = (e.get(kind) or {}).get("metadata") or {}
        if meta.get("urn", "").endswith(f"::{urn_suffix}"):
            return e["sequence"]
    raise AssertionError(f"no {kind} for {urn_suffix} in the event log")


def output(result: subprocess.CompletedProcess) -> str:
    return (result.stdout or "") + (result.stderr or "")


def up_in_background(stack: Stack, event_log: Path) -> subprocess.Popen:
    return subprocess.Popen(stack.command("up", "--yes", "--skip-preview", f"--event-log={event_log}"),
                            cwd=stack.project_dir, env=stack.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_event(proc: subprocess.Popen, log: Path, kind: str, urn_suffix: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if log.exists():
            try:
                seq(events(log), kind, urn_suffix)
                return
            except AssertionError:
                pass
        assert proc.poll() is None, f"`pulumi up` ended before {kind} of {urn_suffix}:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, f"no {kind} of {urn_suffix} within {timeout:g} s"
        time.sleep(0.2)


# --- one node -----------------------------------------------------------------------------------


def test_one_node_zone_ready_with_cilium_before_health_and_cert_manager_after(lab, tmp_path):
    stack = new_stack(tmp_path, lab, zone("one", ONE))
    log = tmp_path / "events.jsonl"
    stack.up(f"--event-log={log}")
    assert ready(stack, "one")
    evs = events(log)
    cilium_done = seq(evs, "resOutputsEvent", "e2e-one-cilium")
    health_start, health_done = seq(evs, "resourcePreEvent", "e2e-one-health"), seq(evs, "resOutputsEvent", "e2e-one-health")
    cert_manager_start = seq(evs, "resourcePreEvent", "e2e-one-cert-manager")
    assert cilium_done < health_start < health_done < cert_manager_start
    assert node_state(ONE[0])["mode"] == "configured"


# --- three control planes and two workers ----------------------------------------------------------


@pytest.fixture(scope="module")
def ha(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ha")
    z = zone("ha", HA_CPS, {"web": HA_WORKERS}, endpoint=f"https://{HA_CPS[0]}:6443")
    return new_stack(tmp, lab, z), z, tmp


def test_three_control_planes_two_workers_ready_with_one_bootstrap(lab, ha):
    stack, _, _ = ha
    nodes = HA_CPS + HA_WORKERS
    before = calls(nodes)
    stack.up()
    assert ready(stack, "ha")
    d = delta(before, calls(nodes))
    assert sum(c.get("Bootstrap", 0) for c in d.values()) == 1, d
    assert all(node_state(a)["mode"] == "configured" for a in nodes)


def test_second_up_changes_nothing_and_mutates_no_node(lab, ha):
    stack, _, _ = ha
    if not ready(stack, "ha"):
        pytest.skip("the HA zone did not come up")
    before = calls(all_nodes())
    result = stack.up("--expect-no-changes")  # fails on any change
    assert "unchanged" in result.stdout
    assert mutating(delta(before, calls(all_nodes()))) == {}


def test_worker_pool_label_change_reapplies_only_that_pools_nodes(lab, ha):
    stack, z, _ = ha
    if not ready(stack, "ha"):
        pytest.skip("the HA zone did not come up")
    z = zone("ha", HA_CPS, {"web": HA_WORKERS}, endpoint=z["controlPlane"]["endpoint"],
             labels={"web": {"e2e.kontinuum.sh/tier": "web"}})
    write_config(stack, lab, z)
    before = calls(all_nodes())
    stack.up()
    d = delta(before, calls(all_nodes()))
    applied = {a: c["ApplyConfiguration"] for a, c in d.items() if c.get("ApplyConfiguration")}
    assert applied == {a: 1 for a in HA_WORKERS}
    assert mutating({a: c for a, c in d.items() if a not in HA_WORKERS}) == {}
    assert ready(stack, "ha")


# --- crashes and hangs ------------------------------------------------------------------------------


def test_up_killed_after_config_apply_converges_on_rerun(lab, tmp_path):
    stack = new_stack(tmp_path, lab, zone("kill", KILL))
    log = tmp_path / "events.jsonl"
    proc = up_in_background(stack, log)
    try:
        wait_for_event(proc, log, "resOutputsEvent", "e2e-kill-controlplane-0", timeout=180)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        kill_strays(ROOT)
    assert node_state(KILL[0])["mode"] == "configured"
    # The killed run left its lock (backend/.pulumi/locks/<org>/<project>/<stack>/<id>.json); on the
    # file backend `pulumi cancel` just deletes the stack's lock files, and the next up may run.
    locks = lambda: list((stack.state_dir / "backend" / ".pulumi" / "locks").rglob("*.json"))  # noqa: E731
    assert locks(), "a killed up leaves its lock behind"
    stack.run("cancel", "--yes")
    assert not locks()
    stack.up()
    assert ready(stack, "kill")
    assert sum(c.get("Bootstrap", 0) for c in calls(KILL).values()) <= 2  # at most once per run


def test_hung_worker_fails_bounded_naming_it_then_converges(lab, tmp_path):
    apply_bound = 15
    # cert-manager cannot schedule on a tainted control plane: it waits for the hung worker too,
    # so its bound is short as well.
    z = zone("hang", [HANG_CP], {"web": [HANG_WORKER]}, timeouts={**TIMEOUTS, "apply": apply_bound, "certManager": 45})
    stack = new_stack(tmp_path, lab, z)
    log = tmp_path / "events.jsonl"
    proc = up_in_background(stack, log)
    try:
        # The worker was discovered (before the control-plane pool); hang it before its ConfigApply.
        wait_for_event(proc, log, "resOutputsEvent", "e2e-hang-controlplane-0", timeout=180)
        set_faults(HANG_WORKER, hang=True)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=300)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            kill_strays(ROOT)
        set_faults(HANG_WORKER, hang=False)
    assert proc.returncode != 0
    assert elapsed < 150, f"the failure took {elapsed:.0f} s"
    assert f"ConfigApply {HANG_WORKER}: the node to accept its machine config: not reached within {apply_bound} s" \
        in out, out[-3000:]
    assert node_state(HANG_WORKER)["mode"] == "maintenance"
    stack.up()
    assert ready(stack, "hang")
    assert node_state(HANG_WORKER)["mode"] == "configured"
