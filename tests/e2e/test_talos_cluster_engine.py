"""TalosCluster under the real engine (issue 7): the repo's own program on an embedded lab.

One lab for the session (tests/e2e/cluster_lab.py: lab.supervisor through `python -m lab up`,
its own state folder, nodes 127.0.33.11+, hub 127.0.0.33), shared with the edit matrix. Every test runs the main program (repo root) with its own stack,
whose config file lives in tmp (Stack.config_file), never in the repo's stacks/. Assertions
are on what an operator sees: stack outputs, the engine's event log, the nodes' call counters.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from lab.pulumi_cli import ROOT, kill_strays
from tests.e2e.cluster_lab import (HA_CPS, HA_WORKERS, HANG_CP, HANG_WORKER, KILL, ONE, TIMEOUTS, all_nodes, calls,
                                   delta, events, member, mutating, new_stack, node_state, ready, seq, set_faults,
                                   up_in_background, wait_for_event, write_config, zone)


@pytest.fixture
def lab(cluster_lab):
    return cluster_lab


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
    retire(stack)


def retire(stack) -> None:
    """Destroy a zone no later test uses: its cluster would load the shared lab for the rest of the run."""
    stack.destroy(timeout=600)


# --- three control planes and two workers ----------------------------------------------------------


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
        wait_for_event(proc, log, "resOutputsEvent", member("kill", KILL[0]), timeout=180)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        kill_strays(ROOT, stack.state_dir)
    assert node_state(KILL[0])["mode"] == "configured"
    # The killed run left its lock (backend/.pulumi/locks/<org>/<project>/<stack>/<id>.json); the
    # plain re-run clears it (its engine is provably gone: tools/pulumi runs `kontinuum recover`).
    locks = lambda: list((stack.state_dir / "backend" / ".pulumi" / "locks").rglob("*.json"))  # noqa: E731
    assert locks(), "a killed up leaves its lock behind"
    stack.up()
    assert not locks()
    assert ready(stack, "kill")
    assert sum(c.get("Bootstrap", 0) for c in calls(KILL).values()) <= 2  # at most once per run
    retire(stack)


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
        wait_for_event(proc, log, "resOutputsEvent", member("hang", HANG_CP), timeout=180)
        set_faults(HANG_WORKER, hang=True)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=300)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            kill_strays(ROOT, stack.state_dir)
        set_faults(HANG_WORKER, hang=False)
    assert proc.returncode != 0
    assert elapsed < 150, f"the failure took {elapsed:.0f} s"
    assert f"ConfigApply {HANG_WORKER}: the node to accept its machine config: not reached within {apply_bound} s" \
        in out, out[-3000:]
    assert node_state(HANG_WORKER)["mode"] == "maintenance"
    stack.up()
    assert ready(stack, "hang")
    assert node_state(HANG_WORKER)["mode"] == "configured"
    retire(stack)
