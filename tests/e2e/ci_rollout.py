"""The staged rollout of tests/e2e/test_ci_engine.py, on that module's lab and regions:
`python -m kontinuum rollout --waves r1,r3/r2`, the release job's command (ci/).

r1 (one zone) and r3 (a region without zones) form wave 1, r2 (a zone with a worker) wave 2.
r3's stack file first names a hub kubeconfig that is not there, which the program refuses at up:
the rollout stops after wave 1 naming r3 and the engine's error, and r2 is never touched. Fixed,
a re-run skips r1 (done, unchanged), rolls out r3, gates wave 1 on its zones' health and rolls
out r2, whose worker is down: the gate holds the rollout, naming the node. Once the worker is
back, a re-run passes the gate without a second up; a last one does nothing at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from lab.pulumi_cli import ROOT, Stack
from lab.talos_node import control
from tests.e2e import cluster_lab


def kontinuum_rollout(place: Path, env: dict, *args: str, timeout: float = 900):
    """(result, Markdown, JSON report, seconds) of a rollout on the module's stacks and backend."""
    md, js = place / "rollout.md", place / "rollout.json"
    for f in (md, js):
        f.unlink(missing_ok=True)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "kontinuum", "rollout", "--waves", "r1,r3/r2", "--stacks-dir",
                        str(place / "stacks"), "--state", str(place / "rollout-state.json"), "--soak", "4",
                        "--interval", "2", "--timeout", "600", "--markdown", str(md), "--json", str(js), *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return r, (md.read_text() if md.exists() else ""), json.loads(js.read_text()) if js.exists() else None, \
        time.monotonic() - t0


def last_update(stack: Stack) -> str:
    """When the stack's state was last written (each up writes it; read without the engine)."""
    return stack.export()["deployment"]["manifest"]["time"]


def statuses(report: dict) -> list[list[tuple[str, str]]]:
    return [[(x["stack"], x["status"]) for x in w["regions"]] for w in report["waves"]]


def staged_rollout(lab: Path, place: Path, r1: Stack, r2: Stack, r3: Stack, *, dead_worker: str) -> None:
    config = cluster_lab.stack_config(lab, {}, "r3")
    config["config"].update({"kontinuum:zones": [], "kontinuum:allowEmptyRegion": True,
                             "kontinuum:hubKubeconfigFile": str(place / "no-hub" / "kubeconfig")})
    r3.write_config_file(config)
    env, took = r1.env(), {}
    before = {s.name: last_update(s) for s in (r1, r2)}

    r, md, report, took["failed up"] = kontinuum_rollout(place, env)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "wave 1: stack r3: up failed: error: kontinuum:hubKubeconfigFile: cannot read" in r.stderr, r.stderr
    assert statuses(report) == [[("r1", "done"), ("r3", "failed")], [("r2", "not-started")]]
    assert [w["status"] for w in report["waves"]] == ["failed", "not started"]
    assert "**up failed**" in md and "no-hub/kubeconfig" in md
    assert last_update(r1) != before["r1"] and last_update(r2) == before["r2"]  # the second wave never started

    r, md, _, took["preview"] = kontinuum_rollout(place, env, "--preview")
    assert r.returncode == 2, r.stdout + r.stderr  # r3 has changes to make
    assert "- `r1`: skipped: done at" in md and "#### Region `r3` (stack `r3`)" in md, md
    assert "#### Region `r2` (stack `r2`): no changes" in md, md

    config["config"]["kontinuum:hubKubeconfigFile"] = str(lab / "hub" / "kubeconfig")
    r3.write_config_file(config)
    done_r1 = last_update(r1)
    control.crash(dead_worker)
    try:
        r, md, report, took["resumed, gate held"] = kontinuum_rollout(place, env, "--ready-timeout", "12")
    finally:
        control.power_on(dead_worker)
    assert r.returncode == 4, r.stdout + r.stderr
    assert statuses(report) == [[("r1", "skipped"), ("r3", "done")], [("r2", "done")]]
    assert [w["status"] for w in report["waves"]] == ["done", "unhealthy"]
    assert "every zone of r1, r3 is ready" in r.stderr and "every zone ready and healthy for 4 s" in md
    assert "wave 2: the health gate failed: zones not ready within 12 s" in r.stderr, r.stderr
    assert f"{dead_worker} do not answer the Talos API" in md, md
    assert last_update(r1) == done_r1 and last_update(r2) != before["r2"]

    up_r2 = last_update(r2)
    r, md, report, took["gate again"] = kontinuum_rollout(place, env, "--ready-timeout", "240")
    assert r.returncode == 0, r.stdout + r.stderr
    assert statuses(report) == [[("r1", "skipped"), ("r3", "skipped")], [("r2", "skipped")]]
    assert [w["status"] for w in report["waves"]] == ["done", "done"]
    assert last_update(r2) == up_r2  # the gate again, no second up
    progress = json.loads((place / "rollout-state.json").read_text())["regions"]
    assert {k: v["status"] for k, v in progress.items()} == {"r1": "healthy", "r2": "healthy", "r3": "healthy"}

    done = {s.name: last_update(s) for s in (r1, r2, r3)}
    r, md, report, took["nothing to do"] = kontinuum_rollout(place, env)
    assert r.returncode == 0 and [x for w in statuses(report) for _, x in w] == ["skipped"] * 3
    assert {s.name: last_update(s) for s in (r1, r2, r3)} == done
    assert md.count("every zone was already healthy (nothing rolled out)") == 2, md
    print("rollout runs: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))
