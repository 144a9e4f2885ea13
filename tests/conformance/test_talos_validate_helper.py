"""kontinuum-talos-validate (tools/builders/talos-validate): Talos's own validator for every
rendered config of a stack, in one process, as `pulumi preview` and `python -m kontinuum check`
call it. Built here from its pinned module the way tools/install.sh builds it."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kontinuum.stackconfig import render_check
from kontinuum.stackconfig.parse import parse
from tests.unit.test_stack_config import FULL

BUILDER = Path(__file__).parents[2] / "tools" / "builders" / "talos-validate"
PINNED = "v1.13.0"


@pytest.fixture(scope="module")
def helper(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("helper") / render_check.VALIDATOR
    go = shutil.which("go") or "/usr/local/go/bin/go"
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    proc = subprocess.run([go, "build", "-ldflags", f"-X main.version={PINNED}", "-o", str(out), "."], cwd=BUILDER,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert subprocess.run([str(out), "--version"], capture_output=True, text=True, timeout=10).stdout.strip() == PINNED
    return str(out)


def test_valid_stack_passes_talos_validator_in_one_batch(helper):
    raw = copy.deepcopy(FULL)
    raw["zones"] += [{"zone": f"z{i}", "talosAddresses": [f"10.1.{i}.1"]} for i in range(20)]
    started = time.monotonic()
    report = render_check.check(parse(raw), raw, validator=helper)
    elapsed = time.monotonic() - started
    assert report.errors == [] and report.configs == 22
    print(f"22 configs rendered in {elapsed:.2f}s, Talos validator {report.validator_seconds:.3f}s")
    assert report.validator_seconds < 10


def test_talos_rejects_what_only_talos_knows_with_zone_pool_and_node(helper):
    raw = copy.deepcopy(FULL)
    raw["zones"][0]["workers"][0]["patches"] = [{"machine": {"kubelet": {"nodeIP": {"validSubnets": ["not-a-cidr"]}}}}]
    raw["zones"][0]["controlPlane"]["patches"] = [{"machine": {"installDiskk": "/dev/sdb", "registry": {"pasword": "s3cr3t"}}}]
    out = [str(e) for e in render_check.check(parse(raw), raw, validator=helper).errors]
    assert len(out) == 2, out
    cp, worker = sorted(out)
    assert cp.startswith("zones[0].controlPlane: Talos rejects the patched machine config: load:")
    assert "unknown keys machine.installDiskk, machine.registry.pasword" in cp and "s3cr3t" not in cp
    assert cp.endswith("(zone eu-1a, pool controlplane, nodes 10.0.0.5, 10.0.0.6, 10.0.0.7)")
    assert worker.startswith("zones[0].workers[0]: Talos rejects the patched machine config:")
    assert worker.endswith("(zone eu-1a, pool general, node 10.0.1.21)")
