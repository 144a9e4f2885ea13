"""Talos's own Go client (pkg/machinery/client v1.13.0) against our Talos node emulator.

The program in ./talosclient does what talosctl does: an insecure maintenance-mode
apply-config, then, with a talosconfig we generate, Version, Bootstrap, Kubeconfig,
EtcdMemberList, talosctl upgrade-k8s's Talos calls (the pre-flight's StaticPod and KubeletSpec reads, the pre-pull's MachineService.ImagePull and
the bootstrap Manifests listed and decoded from COSI), an OS upgrade as talosctl 1.13 makes it (boot id Read, ImageService.Pull,
LifecycleService.Upgrade, Reboot, new boot id and version) and Reset, and fails on the first reply that a real node would not give.
This keeps the emulator honest: our Python client passing against it proves little unless
Talos's client accepts it too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.clusterspec import ClusterSpec
from lab.talos_node import Lab

GO_MODULE = Path(__file__).parent / "talosclient"
TIMEOUT = 900  # the first build compiles machinery and gRPC


def _go() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if not found:
        pytest.fail("Go toolchain not found (need `go` on PATH or /usr/local/go/bin/go) to run Talos's client against the emulator")
    return found


def test_talos_go_client_accepts_the_emulator(tmp_path: Path) -> None:
    go = _go()
    with Lab(reboot_delay=0.3) as lab:
        node = lab.add_node()
        # Talos's client resets the whole system disk by default: the machine comes back in
        # maintenance mode only by booting from the network, which this one does.
        node.set_faults(netboot=True)
        bundle = secrets.generate()
        spec = ClusterSpec(name="conformance", endpoint=f"https://{node.address}:6443", kubernetes_version="1.34.1")
        config = tmp_path / "controlplane.yaml"
        config.write_bytes(mc.render(spec, bundle))
        client_cert = talosconfig.issue_client_cert(bundle.os)
        talos_config = tmp_path / "talosconfig"
        talos_config.write_text(talosconfig.render("conformance", [node.address], [node.address], bundle.os.crt, client_cert))

        env = {**os.environ, "GOFLAGS": "-mod=mod", "HOME": os.environ.get("HOME", str(tmp_path))}
        out = subprocess.run(
            [go, "run", ".", "-endpoint", node.address, "-config", str(config), "-talosconfig", str(talos_config)],
            cwd=GO_MODULE,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert out.returncode == 0, f"Talos Go client failed against the emulator:\n{out.stdout}\n{out.stderr}"
        assert out.stdout.rstrip().endswith("OK"), out.stdout
        calls = node.calls
    for method in ("ApplyConfiguration", "Version", "Bootstrap", "Kubeconfig", "EtcdMemberList", "Read", "Pull",
                   "Upgrade", "Reboot", "Reset"):
        assert calls.get(method), f"the Go client never reached {method}: {calls}"
