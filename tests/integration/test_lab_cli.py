"""`python -m lab up` / `status` / `down` as a user runs them: a detached supervisor with the hub,
an emulated node and, once a cluster is bootstrapped on it, that cluster's control plane and
kwok; `down` must leave none of those processes behind. Addresses 127.0.31.0-31 are this
module's own, and its state directory is a temporary one, so a developer's lab is untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from kubernetes import client, config as kconfig

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import ClusterSpec
from lab.process import pid_alive, wait_until

ROOT = Path(__file__).resolve().parents[2]
HUB = "127.0.31.2"
NODE = "127.0.31.11"


def lab(state: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", "--state-dir", str(state), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def alive(pid: int) -> bool:
    """Running and not a zombie (a detached supervisor may be adopted by a non-reaping init)."""
    if not pid_alive(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    except OSError:
        return False


def test_up_status_down_leaves_nothing_running(tools_bin, tmp_path):
    state = tmp_path / "lab"
    kubeconfig = state / "hub" / "kubeconfig"
    supervisor, children = 0, {}
    up = lab(state, "up", "--nodes", "1", "--first-address", NODE, "--hub-address", HUB, "--acme-address", "",
             "--ttl", "900")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        supervisor = int((state / "supervisor.pid").read_text())
        assert NODE in up.stdout and str(kubeconfig.resolve()) in up.stdout and "kontinuum:zones" in up.stdout
        hub = client.CoreV1Api(kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig.read_text())))
        assert hub.list_namespace(_request_timeout=10).items

        again = lab(state, "up", "--nodes", "1", "--first-address", NODE, "--hub-address", HUB, "--acme-address", "")
        assert again.returncode == 0 and "already running" in again.stdout and str(supervisor) in again.stdout

        # A cluster on the lab's node brings its own control plane and kwok into the lab.
        bundle = secrets.generate()
        spec = ClusterSpec(name="cli", endpoint=f"https://{NODE}:6443", kubernetes_version="1.35.4")
        TalosClient.maintenance(NODE).apply_config(mc.render(spec, bundle))
        cert = talosconfig.issue_client_cert(bundle.os)
        cp = TalosClient.from_talosconfig(talosconfig.parse(talosconfig.render("cli", [NODE], [NODE], bundle.os.crt, cert)))
        wait_until("the node to boot configured", lambda: cp.version(), 30)
        cp.bootstrap()

        def cluster_running():
            status = json.loads((state / "status.json").read_text())
            clusters = status["clusters"]
            return clusters and clusters[0]["state"] == "running" and clusters[0]["nodes"] and status

        status = wait_until("the cluster's control plane in the lab", cluster_running, 150)
        children = status["pids"]
        assert {name.split("/")[-1] for name in children} >= {"etcd", "kube-apiserver", "kube-controller-manager",
                                                               "kube-scheduler", "kwok"}
        shown = lab(state, "status")
        assert shown.returncode == 0 and "running" in shown.stdout and NODE in shown.stdout
    finally:
        down = lab(state, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "0 left running" in down.stdout
    assert supervisor and children
    for name, pid in {"supervisor": supervisor, **children}.items():
        assert not alive(pid), f"{name} (pid {pid}) still runs after `lab down`"
    assert kubeconfig.exists()  # kept for `pulumi preview` with the lab down
    after = lab(state, "status")
    assert after.returncode == 3 and "not running" in after.stdout
