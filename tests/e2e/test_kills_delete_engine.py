"""A killed zone removal or `pulumi destroy` never needs hands (issue 15): the two-zone lab stack,
brought up plainly on a lab of its own, then SIGKILLed inside each kind of resource delete while
a zone is removed, and while the rest is destroyed, each killed run re-run plainly until one
finishes (tests/e2e/kill_chains.py). Afterwards the machines are back in maintenance mode, their
claims returned, and nothing is pending. Creates and a Helm upgrade are killed in
test_kills_create_engine.py; the two modules run side by side.
Addresses 127.0.51.0/24 and hub 127.0.0.51 are this module's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.pulumi_cli import Stack
from lab.talos_node import control
from tests.e2e import kills
from tests.e2e.kill_chains import assert_converged, assert_no_slow_leftovers, chain, claims, lab_config, new_stack, \
    zones
from tests.e2e.labs import running_lab

FIRST = "127.0.51.11"
HUB_ADDRESS = "127.0.0.51"
ADDRESSES = ["127.0.51.11", "127.0.51.12"]
_, ZONE_A, ZONE_B = zones(ADDRESSES)  # zone a with its Cilium values set, as the create module leaves it
DELETES_KILLED: set[str] = set()  # kinds of delete the zone removal chain killed


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("kills-delete-lab"), nodes=len(ADDRESSES), first_address=FIRST,
                     hub_address=HUB_ADDRESS) as state:
        yield state


@pytest.fixture(scope="module")
def stack(lab: Path, tmp_path_factory) -> Stack:
    s = new_stack(lab, tmp_path_factory.mktemp("kills-delete"), "e2e-kills-delete", [ZONE_A, ZONE_B])
    up = s.run("up", "--yes", "--skip-preview", check=False, timeout=900)
    assert up.returncode == 0, (up.stdout + up.stderr)[-6000:]
    return s


def test_removing_a_zone_killed_in_every_kind_of_delete_finishes_on_plain_reruns(lab, stack):
    stack.write_config_file({"config": lab_config(lab, [ZONE_A])})
    done, wall = chain(stack, "up", "delete")
    print(f"zone removal chain: {len(done)} kills, {wall:.0f} s")
    DELETES_KILLED.update(k.kind for k in done)
    assert {"helm", "kubernetes"} <= {k.kind for k in done}
    assert_no_slow_leftovers(done)
    assert control.read_state(ADDRESSES[1])["mode"] == "maintenance"
    assert set(claims(lab, "b").values()) <= {None}
    assert_converged(stack)
    assert stack.outputs()["zones"]["a"]["ready"] is True


def test_destroy_killed_in_every_kind_of_delete_finishes_on_a_plain_rerun(lab, stack):
    if not kills.checkpoint(stack).get("resources"):
        pytest.skip("the stack did not come up")
    # Kinds whose delete the zone removal killed already are not killed again (the suite's time),
    # but for Helm releases and Kubernetes objects: the destroy is killed in those as well.
    done, wall = chain(stack, "destroy", "delete", skip=DELETES_KILLED - {"helm", "kubernetes"})
    print(f"destroy chain: {len(done)} kills, {wall:.0f} s")
    assert {"helm", "kubernetes"} <= {k.kind for k in done}
    assert_no_slow_leftovers(done)
    assert control.read_state(ADDRESSES[0])["mode"] == "maintenance"
    assert set(claims(lab, "a").values()) <= {None}
    assert kills.checkpoint(stack).get("resources") in (None, [])
    assert kills.pending(stack) == []
