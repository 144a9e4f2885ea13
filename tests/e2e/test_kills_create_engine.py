"""A killed `pulumi up` never needs hands (issue 15), under the real engine on the embedded lab:
a one-zone lab stack (every kind of step a zone has; a second zone would only repeat them), SIGKILLed (its whole session, as a dying CI runner) inside each kind of
resource create (Helm release, Kubernetes object, every dynamic resource) and inside a Helm
upgrade, then re-run plainly through tools/pulumi (which runs `python -m kontinuum recover` first).

Each test is a chain (tests/e2e/kill_chains.py): a run killed inside the first step of a kind not
killed yet, the plain re-run killed in the next new kind, and so on, until a plain run finishes;
every kill is recovered by the run after it, which gets further. The finished run has converged:
the next preview shows no changes and the state holds no pending operation. After every kill
nothing started for the run may outlive it by more than kills.LEFTOVER_BOUND seconds. Deletes
and destroy are killed in test_kills_delete_engine.py, on a lab of their own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab.pulumi_cli import Stack
from tests.e2e import kills
from tests.e2e.kill_chains import assert_converged, assert_no_slow_leftovers, chain, helm_record_watcher, lab_config, \
    new_stack, zones
from tests.e2e.labs import running_lab

FIRST = "127.0.36.11"
HUB_ADDRESS = "127.0.0.36"
ADDRESSES = ["127.0.36.11"]
ZONE_A, ZONE_A_UPGRADED = zones(ADDRESSES)


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("kills-lab"), nodes=len(ADDRESSES), first_address=FIRST,
                     hub_address=HUB_ADDRESS) as state:
        yield state


@pytest.fixture(scope="module")
def stack(lab: Path, tmp_path_factory) -> Stack:
    return new_stack(lab, tmp_path_factory.mktemp("kills"), "e2e-kills", [ZONE_A])


def test_up_killed_in_every_kind_of_create_converges_on_plain_reruns(lab, stack):
    done, wall = chain(stack, "up", "create", helm_record=helm_record_watcher(lab))
    print(f"up chain: {len(done)} kills, {wall:.0f} s")
    kinds = {k.kind for k in done}
    assert {"helm", "kubernetes"} <= kinds, kinds
    assert len([k for k in kinds if k.startswith("dynamic:")]) >= 8, kinds
    # the case: killed inside `helm install` of Cilium, its record left pending-install
    helm = next(k for k in done if k.kind == "helm")
    assert helm.helm_status == "pending-install", helm
    runs = "".join(p.read_text() for p in stack.logs.glob("up-create-*.out"))
    assert "cannot re-use a name" not in runs
    cleared = r"recover: Helm release [a-z-]+/[a-z-]+: deleted record v1 \(pending-install\)"
    assert re.search(cleared, runs), runs[-3000:]
    assert_no_slow_leftovers(done)
    assert_converged(stack)
    zones_out = stack.outputs()["zones"]
    assert {z: zones_out[z]["ready"] for z in zones_out} == {"a": True}


def test_helm_upgrade_killed_midway_converges_on_plain_reruns(lab, stack):
    """New Cilium values for zone a: the upgrade killed with its record pending-upgrade (every
    later upgrade would fail with "another operation is in progress"), then plain re-runs."""
    if not kills.checkpoint(stack).get("resources"):
        pytest.skip("the stack did not come up")
    stack.write_config_file({"config": lab_config(lab, [ZONE_A_UPGRADED])})
    done, wall = chain(stack, "up", "update", helm_record=helm_record_watcher(lab))
    print(f"upgrade chain: {len(done)} kills, {wall:.0f} s")
    helm = [k for k in done if k.kind == "helm"]
    assert helm and helm[0].helm_status == "pending-upgrade", done
    runs = "".join(p.read_text() for p in stack.logs.glob("up-update-*.out"))
    assert "another operation" not in runs
    assert re.search(r"recover: Helm release [a-z-]+/cilium: deleted record v2 \(pending-upgrade\)", runs), runs[-3000:]
    assert_no_slow_leftovers(done)
    assert_converged(stack)
