"""Our secrets.yaml and machine configs, judged by Talos's own machinery (v1.13.0, metal mode).

Python renders the inputs; the Go program in ./config loads them with machinery's secrets
bundle loader and config loader and runs the strict metal-mode validator. Broken configs must
be rejected by machinery and by our precheck, naming the same field.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from kontinuum.talos import machineconfig as mc, secrets
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, NodeSpec, PoolSpec
from kontinuum.talos.precheck import precheck

GO_MODULE = Path(__file__).parent / "config"
FIXTURE = Path(__file__).parents[1] / "unit" / "fixtures" / "talosctl-secrets.yaml"
TIMEOUT = 900

# name -> (pool rendered from, mutation, text machinery and our precheck must both contain)
BROKEN = {
    "worker-cluster-ca-key": ("general", lambda d: d["cluster"]["ca"].update(key=d["_k8s_key"]), "(.cluster.ca)"),
    "worker-machine-ca-key": ("general", lambda d: d["machine"]["ca"].update(key=d["_os_key"]), "(.machine.ca)"),
    "worker-etcd": ("general", lambda d: d["cluster"].update(etcd={"ca": {"crt": d["machine"]["ca"]["crt"]}}), "etcd config is only allowed"),
    "unknown-cni": (CONTROLPLANE, lambda d: d["cluster"]["network"]["cni"].update(name="calico"), "cni name should be one of"),
    "missing-endpoint": (CONTROLPLANE, lambda d: d["cluster"]["controlPlane"].pop("endpoint"), "controlplane endpoint is required"),
    "missing-install-disk": (CONTROLPLANE, lambda d: d["machine"]["install"].pop("disk"), "either install disk or diskSelector"),
    "missing-install": ("general", lambda d: d["machine"].pop("install"), 'install instructions are required in "metal" mode'),
    "controlplane-without-ca-key": (CONTROLPLANE, lambda d: d["machine"]["ca"].pop("key"), "(.machine.ca.key)"),
    "bad-dns-domain": (
        CONTROLPLANE, lambda d: d["cluster"]["network"].update(dnsDomain="bad domain"), "is not a valid DNS name"
    ),
    "persist-disabled": ("general", lambda d: d.update(persist=False), ".persist should be enabled"),
    "unknown-machine-type": ("general", lambda d: d["machine"].update(type="boss"), "unknown machine type"),
}


def _go() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if not found:
        pytest.fail("Go toolchain not found (need `go` on PATH or /usr/local/go/bin/go) to run the Talos machinery conformance check")
    return found


def _spec(**kw) -> ClusterSpec:
    base = dict(
        name="conformance",
        endpoint="https://127.0.0.10:6443",
        kubernetes_version="1.34.1",
        control_plane=PoolSpec(CONTROLPLANE, 3),
        workers=(PoolSpec("general", 2),),
    )
    return ClusterSpec(**{**base, **kw})


def _good_configs(bundle: secrets.SecretsBundle) -> dict[str, bytes]:
    patched = _spec(
        cert_sans=("api.conformance.test", "127.0.0.10"),
        patches=(
            {"cluster": {"inlineManifests": [{"name": "hello", "contents": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: hello\n"}]}},
            [{"op": "add", "path": "/machine/sysctls", "value": {"vm.max_map_count": "262144"}}],
        ),
        control_plane=PoolSpec(CONTROLPLANE, 3, node_labels={"kontinuum.sh/pool": "controlplane"},
                               patches=({"machine": {"kubelet": {"extraArgs": {"max-pods": "150"}}}},)),
        workers=(PoolSpec("general", 2, install_disk="/dev/vda",
                          patches=([{"op": "replace", "path": "/machine/install/wipe", "value": True}],)),),
    )
    node = NodeSpec("node-a", install_disk="/dev/nvme0n1", node_labels={"kontinuum.sh/zone": "a"},
                    patches=({"machine": {"nodeAnnotations": {"kontinuum.sh/node": "node-a"}}},))
    return {
        "cp-single.yaml": mc.render(_spec(control_plane=PoolSpec(CONTROLPLANE, 1), workers=()), bundle),
        "cp-of-three.yaml": mc.render(_spec(), bundle),
        "worker.yaml": mc.render(_spec(), bundle, pool="general"),
        "cp-patched.yaml": mc.render(patched, bundle, node=node),
        "worker-patched.yaml": mc.render(patched, bundle, pool="general", node=node),
    }


def _broken_configs(bundle: secrets.SecretsBundle) -> dict[str, bytes]:
    out = {}
    for name, (pool, mutate, _) in BROKEN.items():
        d = yaml.safe_load(mc.render(_spec(), bundle, pool=pool))
        d["_os_key"], d["_k8s_key"] = base64.b64encode(bundle.os.key).decode(), base64.b64encode(bundle.k8s.key).decode()
        mutate(d)
        del d["_os_key"], d["_k8s_key"]
        out[f"bad-{name}.yaml"] = yaml.safe_dump(d, sort_keys=False).encode()
    return out


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict:
    go = _go()
    tmp = tmp_path_factory.mktemp("conformance")
    bundle = secrets.generate()
    (tmp / "secrets.yaml").write_text(secrets.dump(bundle))
    args = ["-secrets", str(tmp / "secrets.yaml"), "-secrets", str(FIXTURE)]
    for name, data in _good_configs(bundle).items():
        (tmp / name).write_bytes(data)
        args += ["-good", str(tmp / name)]
    broken = _broken_configs(bundle)
    for name, data in broken.items():
        (tmp / name).write_bytes(data)
        args += ["-bad", str(tmp / name)]

    env = dict(os.environ, GOFLAGS="-mod=mod")
    env.setdefault("GOCACHE", str(Path.home() / ".cache" / "go-build"))
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [go, "run", ".", *args], cwd=GO_MODULE, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`go run .` in {GO_MODULE} did not finish within {TIMEOUT}s (first machinery build is slow)")
    elapsed = time.monotonic() - started
    try:
        results = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"`go run .` in {GO_MODULE} failed (exit {proc.returncode}) before judging anything; "
            f"a module that cannot be fetched or a build error shows here:\n{proc.stderr[-4000:]}"
        )
    print(f"go run took {elapsed:.1f}s\n{proc.stderr}")
    return {
        "by_file": {Path(r["file"]).name: r for r in results},
        "broken": {name: (tmp / name).read_bytes() for name in broken},
    }


def test_secrets_bundles_load_validate_and_match_talosctl_bytes(verdicts):
    for name in ("secrets.yaml", FIXTURE.name):
        r = verdicts["by_file"][name]
        assert r["ok"], f"{name}: {r.get('error')}"


@pytest.mark.parametrize("name", ["cp-single.yaml", "cp-of-three.yaml", "worker.yaml", "cp-patched.yaml", "worker-patched.yaml"])
def test_generated_configs_pass_strict_metal_validation(verdicts, name):
    r = verdicts["by_file"][name]
    assert r["ok"], f"machinery rejected {name}: {r.get('error')}"
    assert not r.get("warnings")


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_configs_are_rejected_by_machinery_and_precheck(verdicts, case):
    name = f"bad-{case}.yaml"
    r = verdicts["by_file"][name]
    field = BROKEN[case][2]
    assert not r["ok"], f"machinery accepted {name}"
    machinery_error = r["error"]
    assert field in machinery_error, machinery_error

    ours = precheck(verdicts["broken"][name])
    assert ours, f"precheck accepted {name}; machinery said: {machinery_error}"
    assert any(field in p for p in ours), ours
    for problem in ours:  # every problem we report is one machinery reports, in its words
        assert problem.split(": ", 1)[1] in machinery_error, (problem, machinery_error)
