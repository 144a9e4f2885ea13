"""A killed `pulumi destroy` never needs hands (issue 15): a one-zone lab stack, brought up plainly
on a lab of its own, then `pulumi destroy` SIGKILLed inside each kind of resource delete (Helm
releases, Kubernetes objects, every dynamic resource), each killed run re-run plainly until one
finishes (tests/e2e/kill_chains.py). Afterwards the machine is back in maintenance mode, its claim
returned, and nothing is pending.

Removing a zone from the config deletes the same kinds of resource through `pulumi up`: its
deletes are the ones killed here, and the removal itself is proven in test_zones_engine.py.
Creates and a Helm upgrade are killed in test_kills_create_engine.py; the two modules run side by side.
Addresses 127.0.51.0/24 and hub 127.0.0.51 are this module's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.pulumi_cli import Stack
from lab.talos_node import control
from tests.e2e import kills
from tests.e2e.kill_chains import assert_no_slow_leftovers, chain, claims, new_stack, zones
from tests.e2e.labs import running_lab

FIRST = "127.0.51.11"
HUB_ADDRESS = "127.0.0.51"
ADDRESSES = ["127.0.51.11"]
_, ZONE_A = zones(ADDRESSES)  # with its Cilium values set, as the create module leaves it


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("kills-delete-lab"), nodes=len(ADDRESSES), first_address=FIRST,
                     hub_address=HUB_ADDRESS) as state:
        yield state


@pytest.fixture(scope="module")
def stack(lab: Path, tmp_path_factory) -> Stack:
    s = new_stack(lab, tmp_path_factory.mktemp("kills-delete"), "e2e-kills-delete", [ZONE_A])
    up = s.run("up", "--yes", "--skip-preview", check=False, timeout=900)
    assert up.returncode == 0, (up.stdout + up.stderr)[-6000:]
    return s


def test_destroy_killed_in_every_kind_of_delete_finishes_on_plain_reruns(lab, stack):
    done, wall = chain(stack, "destroy", "delete")
    print(f"destroy chain: {len(done)} kills, {wall:.0f} s")
    kinds = {k.kind for k in done}
    assert {"helm", "kubernetes"} <= kinds, kinds
    assert len([k for k in kinds if k.startswith("dynamic:")]) >= 6, kinds
    assert_no_slow_leftovers(done)
    assert control.read_state(ADDRESSES[0])["mode"] == "maintenance"
    assert set(claims(lab, "a").values()) <= {None}
    assert kills.checkpoint(stack).get("resources") in (None, [])
    assert kills.pending(stack) == []
