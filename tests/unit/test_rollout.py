"""Staged rollouts (issue 30) without an engine: the waves from --waves and a fleet file, where a
re-run resumes (done and unchanged regions skipped, healthy waves not probed again), the run
stopping at the first failure before the next wave, the health gate and the bounded up."""

from __future__ import annotations

import argparse
import fcntl
import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from kontinuum import rollout_plan as rp, rollout_runner
from kontinuum.cli import rollout

# --- waves and fleet files ---------------------------------------------------------------------


def test_waves_from_the_command_line():
    waves = rp.parse_waves("dev/staging-eu, staging-us/eu,us")
    assert [(w.name, w.stacks) for w in waves] == [("wave 1", ["dev"]), ("wave 2", ["staging-eu", "staging-us"]),
                                                   ("wave 3", ["eu", "us"])]
    with pytest.raises(rp.FleetError, match="wave 2 names no stack"):
        rp.parse_waves("dev//eu")
    with pytest.raises(rp.FleetError, match="stack 'eu' is in wave 1 and in wave 2; a region is rolled out once"):
        rp.parse_waves("eu/eu")


def test_a_fleet_file_with_named_waves_soaks_and_paths(tmp_path):
    fleet = tmp_path / "ops" / "fleet.yaml"
    fleet.parent.mkdir()
    fleet.write_text("soak: 600\nparallel: 3\ntimeout: 1800\nstacksDir: ../stacks\n"
                     "waves:\n  - [dev]\n  - name: prod\n    stacks: [eu, us]\n    soak: 1800\n")
    f = rp.load_fleet(fleet)
    assert [(w.name, w.stacks, w.soak) for w in f.waves] == [("wave 1", ["dev"], None), ("prod", ["eu", "us"], 1800.0)]
    assert f.settings == {"soak": 600, "parallel": 3, "timeout": 1800, "stacksDir": (tmp_path / "stacks").resolve()}


@pytest.mark.parametrize("text, message", [
    ("waves: []\n", "needs `waves:`"),
    ("waves: [[a]]\nsoka: 3\n", r"unknown key\(s\) soka"),
    ("waves: [[a]]\nparallel: 0\n", "parallel: 0 is not a number ≥ 1"),
    ("waves: [{stacks: [a], soak: -1}]\n", r"waves\[0\].soak: -1"),
    ("waves: [{stacks: []}]\n", r"waves\[0\].stacks: a non-empty list"),
    ("waves: [[a], [b, a]]\n", "stack 'a' is in wave 1 and in wave 2"),
    ("waves: [[a]\n", "not valid YAML"),
])
def test_a_wrong_fleet_file_is_refused_naming_the_key(tmp_path, text, message):
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(rp.FleetError, match=message):
        rp.load_fleet(path)


# --- resume ------------------------------------------------------------------------------------

FP = {"stackFile": "s1", "program": "p1"}


def state_of(**regions) -> dict:
    return {"version": 1, "regions": {k: {"status": v, "at": "T", "fingerprint": FP} for k, v in regions.items()}}


def test_a_fresh_rollout_runs_and_gates_every_wave():
    plans = rp.plan(rp.parse_waves("a/b,c"), state_of(), {s: FP for s in "abc"})
    assert [(p.to_run, p.gate) for p in plans] == [(["a"], True), (["b", "c"], True)]


def test_a_rerun_skips_done_unchanged_regions_and_probes_only_waves_not_yet_healthy():
    fps = {s: FP for s in "abcd"}
    plans = rp.plan(rp.parse_waves("a/b,c/d"), state_of(a="healthy", b="applied", c="failed"), fps)
    assert [(p.to_run, p.gate) for p in plans] == [([], False), (["c"], True), (["d"], True)]
    assert plans[0].steps[0].why == "done at T; stack file, the files it names and program unchanged"
    assert plans[1].steps[1].why.startswith("failed at T")
    # Both done but the gate failed last time: no up, the gate again.
    plans = rp.plan(rp.parse_waves("a,b"), state_of(a="applied", b="healthy"), fps)
    assert [(p.to_run, p.gate) for p in plans] == [([], True)]


def test_a_changed_stack_file_or_program_rolls_a_done_region_out_again():
    state = state_of(a="healthy", b="healthy")
    plans = rp.plan(rp.parse_waves("a,b"), state, {"a": {**FP, "stackFile": "s2"}, "b": {**FP, "program": "p2"}})
    (p,) = plans
    assert p.to_run == ["a", "b"] and p.gate
    assert [s.why for s in p.steps] == ["done at T, but its stack file changed since",
                                        "done at T, but the program (another Kontinuum version) changed since"]


def test_a_changed_chart_or_ca_file_the_config_names_rolls_a_done_region_out_again(tmp_path):
    chart = tmp_path / "charts" / "cilium"
    chart.mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: cilium\n")
    (tmp_path / "ca.pem").write_text("PEM 1")
    stack = tmp_path / "Pulumi.a.yaml"
    stack.write_text(yaml.safe_dump({"config": {
        "kontinuum:hubKubeconfigFile": "/abs/hub.yaml",
        "kontinuum:hub": {"acme": {"caBundleFile": "ca.pem"},
                          "addons": {"gatewayApi": {"source": "https://example.org/crds.yaml"}}},
        "kontinuum:zones": [{"name": "z", "addons": {"cilium": {"chart": {"path": "charts/cilium"}},
                                                     "certManager": {"chart": {"repo": "r", "chart": "c",
                                                                               "version": "1"}}}}],
        "kontinuum:password": {"secure": "v1:abc"}}}))
    assert rp.referenced_files(stack.read_text()) == ["/abs/hub.yaml", "ca.pem", "charts/cilium"]
    done = rp.fingerprint(stack, "p1", root=tmp_path)
    assert done["files"]["/abs/hub.yaml"] == "absent"
    state = {"version": 1, "regions": {"a": {"status": "healthy", "at": "T", "fingerprint": done}}}
    assert rp.plan(rp.parse_waves("a"), state, {"a": rp.fingerprint(stack, "p1", root=tmp_path)})[0].to_run == []
    (chart / "values.yaml").write_text("x: 1\n")  # a file added to the local chart
    (step,) = rp.plan(rp.parse_waves("a"), state, {"a": rp.fingerprint(stack, "p1", root=tmp_path)})[0].steps
    assert step.run and step.why == "done at T, but a file its config names changed since: charts/cilium"


def test_a_stack_naming_no_file_keeps_the_fingerprint_of_earlier_progress(tmp_path):
    stack = tmp_path / "Pulumi.a.yaml"
    stack.write_text(yaml.safe_dump({"config": {"kontinuum:region": "eu"}}))
    assert set(rp.fingerprint(stack, "p1", root=tmp_path)) == {"stackFile", "program"}


def test_the_program_digest_follows_the_program_not_the_operator_commands(tmp_path):
    for rel in ("__main__.py", "providers/x.py", "kontinuum/core.py", "kontinuum/cli/status.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("1")
    first = rp.program_digest(tmp_path)
    (tmp_path / "kontinuum/cli/status.py").write_text("2")
    (tmp_path / "kontinuum/__pycache__").mkdir()
    (tmp_path / "kontinuum/__pycache__/core.pyc").write_text("x")
    assert rp.program_digest(tmp_path) == first
    (tmp_path / "providers/x.py").write_text("2")
    assert rp.program_digest(tmp_path) != first


def test_an_unreadable_progress_file_is_not_a_fresh_start(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{half")
    with pytest.raises(rp.FleetError, match="removing it rolls out every region again"):
        rp.load_state(path)


# --- a run, with the engine and the probe replaced --------------------------------------------


class Fleet:
    """Stack files, a fake `pulumi up` (failing for `fail`) and a fake gate, for the CLI's run()."""

    def __init__(self, tmp_path: Path, monkeypatch, stacks: str):
        self.dir, self.fail, self.ups, self.gates, self.unhealthy = tmp_path / "stacks", set(), [], [], None
        self.dir.mkdir()
        self.running = self.most = 0
        self.count = threading.Lock()
        found = {}
        for s in stacks:
            (self.dir / f"Pulumi.{s}.yaml").write_text(f"config: {{kontinuum:region: {s}}}\n")
            found[s] = (self.dir / f"Pulumi.{s}.yaml", s, [])
        monkeypatch.setattr(rollout, "precheck", lambda waves, s, args: (found, []))
        monkeypatch.setattr(rp, "program_digest", lambda root=None: "p1")
        monkeypatch.setattr(rollout_runner, "up", self.up)
        monkeypatch.setattr(rollout_runner, "gate", self.gate)

    def up(self, stack, config_file, *, timeout, log_dir=None):
        with self.count:
            self.ups.append(stack)
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.05)
        with self.count:
            self.running -= 1
        if stack in self.fail:
            return rollout_runner.UpResult(stack, False, 1.0, {}, [f"error: {stack}: refused"])
        return rollout_runner.UpResult(stack, True, 2.0, {"update": 1})

    def gate(self, stacks, **kw):
        self.gates.append(list(stacks))
        return self.unhealthy

    def run(self, tmp_path: Path, waves: str, *extra: str) -> tuple[int, str, dict]:
        parser = argparse.ArgumentParser()
        rollout.add_arguments(parser)
        md, js = tmp_path / "out.md", tmp_path / "out.json"
        args = parser.parse_args(["--waves", waves, "--stacks-dir", str(self.dir), "--state", str(tmp_path / "p.json"),
                                  "--markdown", str(md), "--json", str(js), *extra])
        code = rollout.run(args)
        return code, md.read_text(), json.loads(js.read_text())


def statuses(report: dict) -> list[list[tuple[str, str]]]:
    return [[(r["stack"], r["status"]) for r in w["regions"]] for w in report["waves"]]


def test_a_failure_stops_the_rollout_before_the_next_wave_and_a_rerun_resumes(tmp_path, monkeypatch, capsys):
    fleet = Fleet(tmp_path, monkeypatch, "abc")
    fleet.fail = {"b"}
    code, md, report = fleet.run(tmp_path, "a,b/c")
    assert code == 4
    assert statuses(report) == [[("a", "done"), ("b", "failed")], [("c", "not-started")]]
    assert fleet.gates == [] and "c" not in fleet.ups
    assert "rollout: wave 1: stack b: up failed: error: b: refused" in capsys.readouterr().err
    assert "**up failed**" in md and "error: b: refused" in md

    fleet.fail, fleet.ups = set(), []
    code, md, report = fleet.run(tmp_path, "a,b/c")
    assert code == 0 and fleet.ups == ["b", "c"] and fleet.gates == [["a", "b"], ["c"]]
    assert statuses(report) == [[("a", "skipped"), ("b", "done")], [("c", "done")]]
    progress = json.loads((tmp_path / "p.json").read_text())["regions"]
    assert {k: v["status"] for k, v in progress.items()} == {"a": "healthy", "b": "healthy", "c": "healthy"}

    fleet.ups, fleet.gates = [], []
    code, md, _ = fleet.run(tmp_path, "a,b/c")
    assert (code, fleet.ups, fleet.gates) == (0, [], [])
    assert md.count("already healthy") == 2

    fleet.ups = []
    code, _, _ = fleet.run(tmp_path, "a,b/c", "--restart")
    assert code == 0 and sorted(fleet.ups) == ["a", "b", "c"]


def test_within_a_wave_at_most_parallel_ups_and_none_starts_after_a_failure(tmp_path, monkeypatch):
    fleet = Fleet(tmp_path, monkeypatch, "abcdef")
    fleet.run(tmp_path, "a,b,c,d,e,f", "--parallel", "2")
    assert fleet.most == 2 and len(fleet.ups) == 6

    fleet.ups, fleet.fail = [], {"a"}
    (tmp_path / "p.json").unlink()
    code, _, report = fleet.run(tmp_path, "a,b,c", "--parallel", "1")
    assert code == 4 and fleet.ups == ["a"]
    assert statuses(report) == [[("a", "failed"), ("b", "not-started"), ("c", "not-started")]]
    assert report["waves"][0]["regions"][1]["why"] == "not started: another region of this wave failed"


def test_an_unhealthy_wave_stops_the_rollout_and_the_rerun_gates_it_again_without_ups(tmp_path, monkeypatch, capsys):
    fleet = Fleet(tmp_path, monkeypatch, "ab")
    fleet.unhealthy = "a zone became unhealthy 12 s into the 60 s soak:\na/a-1: Node x is not Ready"
    code, md, report = fleet.run(tmp_path, "a/b")
    assert code == 4 and fleet.ups == ["a"]
    assert [w["status"] for w in report["waves"]] == ["unhealthy", "not started"]
    assert "health gate failed: a zone became unhealthy 12 s into the 60 s soak" in capsys.readouterr().err
    assert "a/a-1: Node x is not Ready" in md

    fleet.unhealthy, fleet.ups = None, []
    code, _, _ = fleet.run(tmp_path, "a/b")
    assert code == 0 and fleet.ups == ["b"] and fleet.gates[-2:] == [["a"], ["b"]]


def test_a_second_rollout_on_the_same_progress_file_is_refused(tmp_path, monkeypatch, capsys):
    fleet = Fleet(tmp_path, monkeypatch, "a")
    with open(tmp_path / "p.json.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        parser = argparse.ArgumentParser()
        rollout.add_arguments(parser)
        args = parser.parse_args(["--waves", "a", "--stacks-dir", str(fleet.dir), "--state", str(tmp_path / "p.json")])
        assert rollout.run(args) == 4
    assert "another rollout is running" in capsys.readouterr().err and fleet.ups == []


def test_bad_waves_are_invalid_input(capsys):
    parser = argparse.ArgumentParser()
    rollout.add_arguments(parser)
    assert rollout.run(parser.parse_args(["--waves", "a//b"])) == 3
    assert "wave 2 names no stack" in capsys.readouterr().err


def test_an_unknown_stack_is_invalid_and_nothing_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rollout_runner, "up", lambda *a, **kw: pytest.fail("an up started"))
    parser = argparse.ArgumentParser()
    rollout.add_arguments(parser)
    (tmp_path / "Pulumi.a.yaml").write_text("config:\n  kontinuum:region: [\n")
    code = rollout.run(parser.parse_args(["--waves", "a/nope", "--stacks-dir", str(tmp_path), "--state",
                                          str(tmp_path / "p.json")]))
    out = capsys.readouterr()
    assert code == 3 and "unknown stack 'nope'" in out.err and "not valid YAML" in out.out
    assert not (tmp_path / "p.json").exists()


# --- the engine's output, the bound, the gate -------------------------------------------------


def test_the_engines_error_lines_from_up_json():
    """As the pinned engine prints them: the preview's document, then the update's events."""
    preview = {"steps": [], "diagnostics": [{"severity": "warning", "message": "warning: no hub\n"}],
               "changeSummary": {"create": 2}}
    events = [{"sequence": 1, "diagnosticEvent": {"prefix": "debug: ", "message": "registering\n", "severity": "debug"}},
              {"sequence": 2, "diagnosticEvent": {"prefix": "error: ", "severity": "error",
                                                  "message": "kontinuum:hubKubeconfigFile: cannot read x\n"}},
              {"sequence": 3, "diagnosticEvent": {"prefix": "error: ", "severity": "error",
                                                  "message": "Resource monitor has terminated, shutting down\n"}},
              {"sequence": 4, "summaryEvent": {"resourceChanges": {"create": 1, "same": 0}, "result": "failed"}},
              {"sequence": 5, "cancelEvent": {}}]
    out = json.dumps(preview, indent=4) + "\n" + "".join(json.dumps(e) + "\n" for e in events)
    docs = rollout_runner.json_documents(out)
    assert len(docs) == 6 and rollout_runner.changes(docs) == {"create": 1}
    assert rollout_runner.changes(docs[:1]) == {"create": 2}
    assert rollout_runner.error_lines(out, "", 1) == ["error: kontinuum:hubKubeconfigFile: cannot read x"]
    assert rollout_runner.error_lines("", "warning: x\nerror: the stack is currently locked\n", 255) == [
        "error: the stack is currently locked"]


def test_an_up_over_its_bound_is_interrupted_then_killed(tmp_path, monkeypatch):
    engine = tmp_path / "pulumi"
    engine.write_text("#!/bin/sh\ntrap '' INT\nsleep 30\n")  # deaf to Ctrl-C
    engine.chmod(0o755)
    monkeypatch.setattr(rollout_runner, "WRAPPER", engine)
    t0 = time.monotonic()
    result = rollout_runner.up("eu", tmp_path / "Pulumi.eu.yaml", timeout=1, grace=1, cwd=tmp_path)
    assert time.monotonic() - t0 < 10
    assert not result.ok and result.errors[0].startswith("`pulumi up` did not finish within 1 s and was interrupted")


def test_logs_keep_each_regions_whole_up_output_owner_only_and_a_failure_points_there(tmp_path, monkeypatch):
    engine = tmp_path / "pulumi"
    engine.write_text('#!/bin/sh\necho \'{"diagnosticEvent":{"severity":"error","message":"boom\\n"}}\'\n'
                      'echo "stderr line" >&2\nexit 1\n')
    engine.chmod(0o755)
    monkeypatch.setattr(rollout_runner, "WRAPPER", engine)
    logs = tmp_path / "logs"
    result = rollout_runner.up("eu", tmp_path / "Pulumi.eu.yaml", timeout=10, cwd=tmp_path, log_dir=logs)
    kept = logs / "eu.log"
    assert not result.ok and result.errors[-1] == f"the whole output: {kept}"
    assert "boom" in kept.read_text() and "stderr line" in kept.read_text()
    assert kept.stat().st_mode & 0o777 == 0o600
    engine.write_text("#!/bin/sh\necho ok\n")
    assert rollout_runner.up("eu", tmp_path / "Pulumi.eu.yaml", timeout=10, cwd=tmp_path, log_dir=logs).ok
    assert "boom" not in kept.read_text() and "ok" in kept.read_text()  # replaced by the next up


def test_the_gate_waits_for_ready_then_fails_on_a_zone_unhealthy_during_the_soak(monkeypatch):
    import kontinuum.recover as recover

    monkeypatch.setattr(recover, "export", lambda stack, cwd, show_secrets: {"deployment": {}})
    seen = iter([{"eu/eu-a": (2, ["Node n1 is not Ready"])}, {"eu/eu-a": (1, [])}, {"eu/eu-a": (0, [])},
                 {"eu/eu-a": (2, ["etcd: member m2 unhealthy"])}])
    monkeypatch.setattr(rollout_runner, "probe", lambda deployments, timeout: next(seen))
    logged = []
    why = rollout_runner.gate(["eu"], ready_timeout=5, soak=0.3, interval=0.05, probe_timeout=1, log=logged.append)
    assert why.startswith("a zone became unhealthy 0 s into the 0.3 s soak:") and "eu/eu-a: etcd: member m2 unhealthy" in why
    assert "is ready after" in logged[0]

    monkeypatch.setattr(rollout_runner, "probe", lambda deployments, timeout: {"eu/eu-a": (3, ["no node answers"])})
    why = rollout_runner.gate(["eu"], ready_timeout=0.2, soak=1, interval=0.05, probe_timeout=1, log=logged.append)
    assert why == "zones not ready within 0.2 s (--ready-timeout):\neu/eu-a: no node answers"


def test_the_probe_passes_warnings_but_holds_a_zone_running_another_version(monkeypatch):
    import datetime as dt

    from kontinuum import status_probe
    from kontinuum.fleet_status import Observation

    far = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=300)
    fine = Observation("eu-a", configured_talos="v1.13.0", talos={"10.0.0.1": "v1.13.0"}, nodes={"n1": (True, "")},
                       expiries={"the Kubernetes CA": far})  # no backup: a warning
    old = Observation("eu-b", configured_talos="v1.13.0", talos={"10.0.0.2": "v1.12.4"}, expiries={"x": far})
    monkeypatch.setattr(status_probe, "observe_stack",
                        lambda d, stack, timeout, now: ("eu", [fine, old, ("c", "no talosconfig in the state")]))
    seen = rollout_runner.probe({"eu": {}}, timeout=1)
    assert seen["eu/eu-a"] == (1, [])
    assert seen["eu/eu-b"] == (2, ["10.0.0.2 runs Talos v1.12.4, the config says v1.13.0"])
    assert seen["eu/c"] == (3, ["no talosconfig in the state"])


def test_the_plan_previews_only_what_runs_and_exits_as_preview(tmp_path, monkeypatch):
    from kontinuum.cli import preview
    from kontinuum.preview_summary import RegionSummary

    fleet = Fleet(tmp_path, monkeypatch, "abc")
    fleet.run(tmp_path, "a/b")  # a and b done and healthy
    (fleet.dir / "Pulumi.b.yaml").write_text("config: {kontinuum:region: b, x: 1}\n")
    previewed = []

    def preview_one(name, path, region, zones, ns):
        previewed.append(name)
        return RegionSummary(stack=name, region=region, status="changes" if name == "b" else "no-changes",
                             counts={"update": 1} if name == "b" else {})

    monkeypatch.setattr(preview, "preview_one", preview_one)
    fleet.ups = []
    code, md, report = fleet.run(tmp_path, "a/b,c", "--preview")
    assert code == 2 and sorted(previewed) == ["b", "c"] and fleet.ups == []
    assert "- `a`: skipped: done at" in md and "healthy before, not probed again" in md
    assert "- `b`: done at" in md and "but its stack file changed since" in md and "#### Region `b`" in md
    assert [[r["run"] for r in w["regions"]] for w in report["waves"]] == [[False], [True, True]]
