"""TalosCluster under the real engine (issue 7): the repo's own program on an embedded lab.

One HA zone (3 control planes, 2 workers) carries every check: its first up with a hung worker
(the order of Cilium, the health check and cert-manager; a bounded failure naming the worker; one
Bootstrap), a no-op second up, a pool edit; test_zone_edits_engine then edits it further. A run
killed after a machine was configured (its lock left behind, the re-run converging) is proven by
the kill chains (test_kills_create_engine.py), which kill every kind of step.

One lab for this package (tests/e2e/cluster_lab.py: lab.supervisor through `python -m lab up`,
its own state folder, nodes 127.0.33.11+, hub 127.0.0.33), shared with the edit matrix. The
program is the repo's own, its stack config in tmp (Stack.config_file), never in stacks/. Assertions
are on what an operator sees: stack outputs, the engine's event log, the nodes' call counters.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from lab.pulumi_cli import ROOT, kill_strays
from tests.e2e.cluster_lab import (HA_APPLY_BOUND, HA_CPS, HA_WORKERS, all_nodes, calls, delta, events, member,
                                   mutating, node_state, ready, seq, set_faults, up_in_background, wait_for_event,
                                   write_config, zone)


@pytest.fixture
def lab(cluster_lab):
    return cluster_lab


# --- three control planes and two workers ----------------------------------------------------------


def test_ha_zone_first_up_names_a_hung_worker_within_its_bound_and_the_rerun_makes_it_ready(lab, ha):
    """The HA zone's first up, its second worker hung (its Talos API never answers) from the moment
    the first control plane is configured: Cilium is Ready before the health check starts and
    cert-manager starts after it passes; the worker's apply fails within its bound, naming it; the
    plain re-run configures it and the zone is ready, with one Bootstrap over both runs."""
    stack, _, tmp = ha
    nodes, hung = HA_CPS + HA_WORKERS, HA_WORKERS[1]
    before = calls(nodes)
    log = tmp / "first-up.jsonl"
    proc = up_in_background(stack, log)
    try:
        wait_for_event(proc, log, "resOutputsEvent", member("ha", HA_CPS[0]), timeout=180)
        set_faults(hung, hang=True)
        out, _ = proc.communicate(timeout=600)
        ended = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            kill_strays(ROOT, stack.state_dir)
        set_faults(hung, hang=False)
    assert proc.returncode != 0
    assert f"ConfigApply {hung}: the node to accept its machine config: not reached within {HA_APPLY_BOUND} s" \
        in out, out[-3000:]
    evs = events(log)
    apply_started = next(e["timestamp"] for e in evs if e["sequence"] == seq(evs, "resourcePreEvent", member("ha", hung)))
    assert ended - apply_started < HA_APPLY_BOUND + 60, f"the failure took {ended - apply_started:.0f} s"
    assert node_state(hung)["mode"] == "maintenance"
    cilium_done = seq(evs, "resOutputsEvent", "e2e-ha-cilium")
    health_start, health_done = seq(evs, "resourcePreEvent", "e2e-ha-health"), seq(evs, "resOutputsEvent", "e2e-ha-health")
    assert cilium_done < health_start < health_done < seq(evs, "resourcePreEvent", "e2e-ha-cert-manager")

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
             labels={"web": {"e2e.kontinuum.sh/tier": "web"}}, timeouts=z["timeouts"])
    write_config(stack, lab, z)
    before = calls(all_nodes())
    stack.up()
    d = delta(before, calls(all_nodes()))
    applied = {a: c["ApplyConfiguration"] for a, c in d.items() if c.get("ApplyConfiguration")}
    assert applied == {a: 1 for a in HA_WORKERS}
    assert mutating({a: c for a, c in d.items() if a not in HA_WORKERS}) == {}
    assert ready(stack, "ha")
