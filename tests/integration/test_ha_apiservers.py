"""An emulated cluster runs a real kube-apiserver per control plane, each down while its machine is
(issue 28), so an outage is measured, not assumed away:
- three control planes behind a load-balanced endpoint (a loopback address no machine has): a
  crashed machine's apiserver is gone (its port refuses, its process is dead) while the API
  answers through the endpoint; powered on, its apiserver answers again, a new process;
- one control plane whose address is the endpoint: the API is down while that machine reboots
  and back after, and a reboot shorter than the lab's tick still restarts the apiserver.
Every certificate is verified as a client of the endpoint would. Addresses 127.0.64.0-31 are this
module's own."""

from __future__ import annotations

import errno
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec
from kontinuum.talos.rotate import k8s_client_cert, k8s_version
from lab.cluster_manager import ClusterManager
from lab.process import pid_alive, wait_until
from lab.talos_node import Lab

LB, CPS = "127.0.64.10", ["127.0.64.11", "127.0.64.12", "127.0.64.13"]
SOLO = "127.0.64.21"
T = 10  # seconds per API call
UP = 120  # seconds for an apiserver to start on a loaded 2-core machine


@pytest.fixture(scope="module")
def bundle() -> secrets.SecretsBundle:
    return secrets.generate()


def talos(bundle: secrets.SecretsBundle, address: str) -> TalosClient:
    cert = talosconfig.issue_client_cert(bundle.os)
    return TalosClient.from_talosconfig(talosconfig.parse(talosconfig.render("lab", [address], [address], bundle.os.crt, cert)))


def bring_up(lab: Lab, bundle, spec: ClusterSpec, addresses: list[str]) -> str:
    """Configure and bootstrap; the kubeconfig Talos hands out (its server: the endpoint)."""
    for a in addresses:
        lab.add_node(a)
        TalosClient.maintenance(a).apply_config(mc.render(spec, bundle))
    for a in addresses:
        lab.node(a).wait_for("configured", 10)
    talos(bundle, addresses[0]).bootstrap()
    return talos(bundle, addresses[-1]).kubeconfig()


def answers(bundle, address: str) -> bool:
    """An admin request to https://<address>:6443, the serving certificate verified for that
    address against the cluster CA."""
    try:
        return bool(k8s_version(f"https://{address}:6443", bundle.k8s.crt, k8s_client_cert(bundle.k8s), T))
    except OSError:
        return False


def refused(address: str) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((address, 6443)) == errno.ECONNREFUSED


def names(mgr: ClusterManager) -> list[str]:
    return sorted(name.split("/", 1)[1] for name in mgr.pids())


def test_an_ha_zone_answers_through_its_endpoint_while_a_control_plane_is_down(tools_bin, bundle, tmp_path):
    spec = ClusterSpec(name="ha-api", endpoint=f"https://{LB}:6443", kubernetes_version="1.35.4",
                       control_plane=PoolSpec(CONTROLPLANE, 3))
    with Lab(pool="127.0.64.8/29", reboot_delay=0.1) as lab, ClusterManager(lab.clusters, tmp_path / "clusters") as mgr:
        kubeconfig = bring_up(lab, bundle, spec, CPS)
        assert f"https://{LB}:6443" in kubeconfig
        wait_until("every control plane's apiserver to answer at its own address",
                   lambda: all(answers(bundle, a) for a in CPS), UP)
        assert names(mgr) == ["etcd", "kube-apiserver", f"kube-apiserver@{CPS[1]}", f"kube-apiserver@{CPS[2]}",
                              "kube-controller-manager", "kube-scheduler", "kwok"]
        api = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))  # verifies the endpoint's name
        core = client.CoreV1Api(api)
        wait_until("3 Nodes through the endpoint", lambda: len(core.list_node(_request_timeout=T).items) == 3, UP)

        crashed = lab.node(CPS[2])
        pid = mgr.pids()[f"ha-api/kube-apiserver@{CPS[2]}"]
        crashed.crash()
        wait_until("the crashed machine's apiserver to refuse, its process gone",
                   lambda: refused(CPS[2]) and not pid_alive(pid), 10)
        for _ in range(12):  # fresh connections: none is sent to the dead one
            assert answers(bundle, LB)
        assert answers(bundle, CPS[0]) and answers(bundle, CPS[1])
        assert len(core.list_node(_request_timeout=T).items) == 3

        crashed.power_on()
        wait_until("its apiserver to answer again", lambda: answers(bundle, CPS[2]), UP)
        assert mgr.pids()[f"ha-api/kube-apiserver@{CPS[2]}"] != pid

        # The hosting node (the lab etcd stays up) reboots: the endpoint answers throughout.
        host = lab.node(CPS[0])
        host.set_faults(reboot_delay=3.0)
        failures, done = [], threading.Event()
        rebooting = threading.Thread(target=lambda: (host.reboot(timeout=30), done.set()), daemon=True)
        rebooting.start()
        wait_until("the rebooting host's apiserver to refuse", lambda: refused(CPS[0]), 10)
        while not done.is_set():
            if not answers(bundle, LB):
                failures.append(time.monotonic())
            time.sleep(0.2)
        rebooting.join(5)
        assert failures == []
        wait_until("the host's apiserver to answer again", lambda: answers(bundle, CPS[0]), UP)
        api.close()


def test_the_endpoint_of_a_control_plane_address_is_down_while_that_machine_reboots(tools_bin, bundle, tmp_path):
    spec = ClusterSpec(name="solo-api", endpoint=f"https://{SOLO}:6443", kubernetes_version="1.35.4")
    with Lab(pool="127.0.64.16/29", reboot_delay=0.1) as lab, ClusterManager(lab.clusters, tmp_path / "clusters") as mgr:
        bring_up(lab, bundle, spec, [SOLO])
        wait_until("the apiserver to answer", lambda: answers(bundle, SOLO), UP)
        node = lab.node(SOLO)

        pid = mgr.pids()["solo-api/kube-apiserver"]
        node.reboot()  # 0.1 s: over before the lab's next tick
        wait_until("a new apiserver process, the old one gone",
                   lambda: mgr.pids().get("solo-api/kube-apiserver") not in (None, pid) and not pid_alive(pid), 10)

        node.set_faults(reboot_delay=3.0)
        started = time.monotonic()
        rebooting = threading.Thread(target=node.reboot, kwargs={"timeout": 30}, daemon=True)
        rebooting.start()
        wait_until("the endpoint to refuse while its machine reboots", lambda: refused(SOLO), 10)
        rebooting.join(30)
        assert node.mode == "configured"
        wait_until("the API back at the endpoint", lambda: answers(bundle, SOLO), UP)
        down = time.monotonic() - started
        assert down >= 3.0, down  # at least the reboot itself
        print(f"API down for {down:.1f} s across a 3 s reboot")
