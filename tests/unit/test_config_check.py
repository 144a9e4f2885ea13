"""Every pool's machine config rendered with all its patches before anything is registered,
and the offline checker (`python -m kontinuum check`) that runs the same validation."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import yaml

from kontinuum.stackconfig import render_check, validation
from kontinuum.stackconfig.parse import parse
from tests.unit.test_stack_config import FULL

ROOT = Path(__file__).parents[2]


def rendered(raw: dict) -> list[str]:
    report = render_check.check(parse(raw), raw, use_validator=False)
    return [str(e) for e in report.errors]


def test_clean_stack_renders_every_pool():
    raw = copy.deepcopy(FULL)
    report = render_check.check(parse(raw), raw, use_validator=False)
    assert report.errors == [] and report.configs == 2  # controlplane and general


def test_every_failing_patch_operation_is_named_with_zone_pool_and_nodes():
    raw = copy.deepcopy(FULL)
    raw["zones"][0]["controlPlane"]["patches"] = [
        {"machine": {"sysctls": {"a": "1"}}},
        [{"op": "remove", "path": "/machine/nope"}, {"op": "add", "path": "/machine/x/y", "value": 1},
         {"op": "test", "path": "/machine/type", "value": "worker"}],
    ]
    raw["zones"][0]["workers"][0]["patches"] = [[{"op": "replace", "path": "/cluster/nothing", "value": 1}]]
    out = rendered(raw)
    nodes = "(zone eu-1a, pool controlplane, nodes 10.0.0.5, 10.0.0.6, 10.0.0.7)"
    assert out == [
        f"zones[0].controlPlane.patches[1][0]: remove failed: /machine/nope: 'nope' does not exist {nodes}",
        f"zones[0].controlPlane.patches[1][1]: add failed: /machine/x/y: 'x' does not exist {nodes}",
        f"zones[0].controlPlane.patches[1][2]: test failed: /machine/type: value differs from the expected one {nodes}",
        "zones[0].workers[0].patches[0][0]: replace failed: /cluster/nothing: 'nothing' does not exist "
        "(zone eu-1a, pool general, node 10.0.1.21)",
    ]


def test_talosctl_shaped_patches_apply_unchanged():
    # paths of a talosctl-made 1.13 config (tests/conformance/test_config_structure.py proves ours has them all)
    raw = copy.deepcopy(FULL)
    raw["zones"][0]["patches"] = [[
        {"op": "replace", "path": "/machine/install/wipe", "value": True},
        {"op": "add", "path": "/machine/kubelet/extraArgs", "value": {"max-pods": "150"}},
        {"op": "add", "path": "/cluster/discovery/registries/service/disabled", "value": True},
        {"op": "replace", "path": "/machine/features/hostDNS/forwardKubeDNSToHost", "value": False},
    ]]
    assert rendered(raw) == []


def test_semantic_checks_run_on_the_patched_result():
    raw = copy.deepcopy(FULL)
    raw["zones"][0]["patches"] = [{"cluster": {"network": {"serviceSubnets": ["10.244.128.0/20"]}}}]
    out = rendered(raw)
    assert any(p.startswith("zones[0].controlPlane: patched config is invalid: cluster.network.serviceSubnets[0] "
                            "10.244.128.0/20 overlaps cluster.network.podSubnets[0] 10.244.0.0/16") for p in out), out
    raw["zones"][0]["patches"] = [{"persist": False}]
    assert ("zones[0].workers[0]: patched config is invalid: persist: .persist should be enabled "
            "(zone eu-1a, pool general, node 10.0.1.21)") in rendered(raw)


def test_a_bad_patch_in_defaults_is_reported_once_under_defaults():
    raw = copy.deepcopy(FULL)
    del raw["zones"][0]["patches"]
    raw["defaults"]["patches"] = [[{"op": "remove", "path": "/machine/nope"}]]
    raw["zones"].append({"zone": "eu-1b", "talosAddresses": ["10.0.9.1"]})
    assert rendered(raw) == ["defaults.patches[0][0]: remove failed: /machine/nope: 'nope' does not exist"]


def test_engine_values_are_read_like_the_stack_file():
    values = {"kontinuum:region": "eu", "kontinuum:zones": '[{"zone": "a", "talosAddresses": ["10.0.0.5"]}]',
              "kontinuum:allowEmptyRegion": "true", "kontinuum:zonez": "[]", "other:key": "x",
              "kontinuum:hub": "not json"}
    raw = validation.from_engine(values)
    assert raw == {"region": "eu", "zones": [{"zone": "a", "talosAddresses": ["10.0.0.5"]}], "allowEmptyRegion": True,
                   "zonez": [], "hub": "not json"}
    out = [str(e) for e in validation.validate(raw, secret_keys=frozenset()).errors]
    assert "kontinuum:zonez: unknown key; did you mean kontinuum:zones?" in out
    assert "hub: must be a mapping, got a string ('not json')" in out


def check(tmp_path: Path, config_doc: dict, *extra: str) -> subprocess.CompletedProcess:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": config_doc, "encryptionsalt": "v1:x"}))
    return subprocess.run([sys.executable, "-m", "kontinuum", "check", str(path), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_checker_exit_codes_and_messages(tmp_path):
    good = {f"kontinuum:{k}": v for k, v in copy.deepcopy(FULL).items()}
    good["kontinuum:hubKubeconfig"] = {"secure": "v1:abc"}
    del good["kontinuum:hubKubeconfigFile"]
    ok = check(tmp_path, good)
    assert ok.returncode == 0, ok.stderr
    assert "ok (1 zone, 2 machine configs rendered and validated)" in ok.stdout

    bad = copy.deepcopy(good)
    bad["kontinuum:hubKubeconfig"] = "apiVersion: v1\nclusters: []"
    bad["kontinuum:zones"][0]["talosVerison"] = "v1.13.0"
    bad["kontinuum:zones"][0]["controlPlane"]["patches"] = [[{"op": "remove", "path": "/machine/nope"}]]
    out = check(tmp_path, bad)
    assert out.returncode == 1
    assert "invalid stack config (kontinuum:…):" in out.stderr
    assert "zones[0].talosVerison: unknown key; did you mean talosVersion?" in out.stderr
    assert "kontinuum:hubKubeconfig: is plain text in the stack config; store it as a secret" in out.stderr
    assert "apiVersion" not in out.stderr and "Traceback" not in out.stderr
    # the contract's problems first; the zone with one is not rendered (Talos would talk about a dropped value)
    assert "remove failed" not in out.stderr

    del bad["kontinuum:zones"][0]["talosVerison"]
    bad["kontinuum:hubKubeconfig"] = {"secure": "v1:abc"}
    out = check(tmp_path, bad)
    assert out.returncode == 1 and "zones[0].controlPlane.patches[0][0]: remove failed" in out.stderr


def test_checker_on_the_shipped_stacks():
    from lab import upstream
    from lab.acme import ensure_ca

    upstream.link(ROOT / ".state" / "lab" / "upstream")  # where the lab stack names them (`lab up` links them)
    ensure_ca(ROOT / ".state" / "lab" / "acme")  # and its ACME server's CA (`lab up` makes it once)
    files = sorted(str(p) for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
    out = subprocess.run([sys.executable, "-m", "kontinuum", "check", *files], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(": ok (") == len(files)


def test_any_mangled_config_gives_config_errors_never_a_crash(monkeypatch):
    """Seeded mutations of a full config (wrong types, nulls, empty containers, junk keys)
    anywhere: the whole check answers with path-precise problems or a stack, nothing else."""
    import random

    monkeypatch.setattr(render_check, "find_validator", lambda: None)  # pure Python here; Go in conformance/
    rng = random.Random(14)
    junk = [None, "", "x", 0, -1, 3.5, True, [], {}, ["a"], {"a": 1}, [{}], "10.0.0.5", "https://x:1"]

    def containers(node, out):
        if isinstance(node, dict):
            out.append(node)
            for v in node.values():
                containers(v, out)
        elif isinstance(node, list):
            out.append(node)
            for v in node:
                containers(v, out)
        return out

    for _ in range(300):
        raw = copy.deepcopy(FULL)
        for _ in range(rng.randint(1, 4)):
            target = rng.choice(containers(raw, []))
            if isinstance(target, dict) and target and rng.random() < 0.8:
                target[rng.choice(list(target))] = copy.deepcopy(rng.choice(junk))
            elif isinstance(target, dict):
                target[rng.choice(["zonez", "x", "talosVersion"])] = copy.deepcopy(rng.choice(junk))
            elif target:
                target[rng.randrange(len(target))] = copy.deepcopy(rng.choice(junk))
        result = validation.validate(raw, secret_keys=None, render=True, validator=None)
        assert result.errors or result.stack is not None
        assert all(e.path or e.problem for e in result.errors)


def test_checker_on_a_broken_file_says_so_in_one_line(tmp_path):
    path = tmp_path / "Pulumi.broken.yaml"
    path.write_text("config:\n  kontinuum:hubKubeconfig: secret-value: [\n")
    out = subprocess.run([sys.executable, "-m", "kontinuum", "check", str(path), str(tmp_path / "Pulumi.none.yaml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert f"{path}: not valid YAML at line 2, column" in out.stderr
    assert f"{tmp_path / 'Pulumi.none.yaml'}: cannot read (No such file or directory)" in out.stderr
    assert "Traceback" not in out.stderr and "secret-value" not in out.stderr
