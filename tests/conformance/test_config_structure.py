"""Our rendered machine configs have the structure `talosctl gen config` gives for the pinned
contract (Talos's own generator, pkg/machinery v1.13.0, run by ./genconfig), so JSON patches
written against talosctl-made configs apply to ours unchanged.

Every key path of machinery's v1alpha1 document must exist in ours (an empty string leaf, such as
a worker's `ca.key: ""`, is exempt: no patch can descend into it and `add` sets it either way);
every path only we have is one of Kontinuum's documented choices below.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kontinuum.talos import machineconfig as mc, secrets
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec

GO_MODULE = Path(__file__).parent / "genconfig"
TIMEOUT = 900

# Paths only in ours, each a deliberate choice (kontinuum/talos/machineconfig.py).
OURS_ONLY = {
    "/cluster/network/cni": "CNI none: Cilium is installed after bootstrap",
    "/cluster/network/cni/name": "CNI none: Cilium is installed after bootstrap",
    "/cluster/proxy/disabled": "Cilium replaces kube-proxy",
    "/machine/install/image": "the zone's talosVersion pins the installer",
    "/machine/features/stableHostname": "single-document stand-in for the HostnameConfig{auto: stable} document",
    "/cluster/apiServer/certSANs": "the endpoint host is a SAN of the API server",
    "/cluster/extraManifests": "empty list, as older talosctl wrote it",
    "/cluster/inlineManifests": "empty list, as older talosctl wrote it",
}
INPUTS = dict(name="conformance", endpoint="https://127.0.0.10:6443", kubernetes_version="1.35.4")


def _paths(node, prefix: str = "", *, skip_empty: bool = False) -> set[str]:
    out = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if skip_empty and value == "":
                continue
            out.add(f"{prefix}/{key}")
            out |= _paths(value, f"{prefix}/{key}", skip_empty=skip_empty)
    elif isinstance(node, list):
        for value in node:
            out |= _paths(value, f"{prefix}/*", skip_empty=skip_empty)
    return out


@pytest.fixture(scope="module")
def generated() -> dict[str, dict]:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    env = dict(os.environ, GOFLAGS="-mod=mod")
    args = ["-name", INPUTS["name"], "-endpoint", INPUTS["endpoint"], "-kubernetes-version", INPUTS["kubernetes_version"]]
    proc = subprocess.run([go, "run", ".", *args], cwd=GO_MODULE, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = {}
    for kind, text in json.loads(proc.stdout).items():
        out[kind] = next(d for d in yaml.safe_load_all(text) if d and d.get("version") == "v1alpha1")
    return out


@pytest.mark.parametrize("kind", ["controlplane", "worker"])
def test_rendered_config_has_talosctl_structure(generated, kind):
    spec = ClusterSpec(**INPUTS, workers=(PoolSpec("general", 1),))
    ours = _paths(mc.build(spec, secrets.generate(), pool=CONTROLPLANE if kind == "controlplane" else "general"))
    needed = _paths(generated[kind], skip_empty=True)
    assert sorted(needed - ours) == [], "paths talosctl makes that our configs lack: patches for them would fail"
    assert sorted(ours - _paths(generated[kind]) - set(OURS_ONLY)) == [], "undocumented difference from talosctl's"


def test_pinned_contract_has_no_machine_network(generated):
    # Talos 1.13 (KubeSpan multi-doc contract) no longer emits the legacy `machine.network: {}`;
    # a JSON patch adding below /machine/network fails on talosctl's config and ours alike.
    assert "network" not in generated["controlplane"]["machine"]
