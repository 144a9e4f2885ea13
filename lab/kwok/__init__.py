"""kwok plays the kubelets of one emulated cluster: one kwok process per cluster control plane.

kwok manages only the Nodes the lab registers (they carry MANAGED_ANNOTATION with the cluster's
name), renews their Leases (a machine that left has its Lease held by the lab instead:
lab/kubelets.py), and walks Nodes and Pods through our own stages (stages.yaml):
Nodes stay NotReady with the kubelet's "network plugin not ready" until the lab sets
CNI_READY_ANNOTATION, Pods bound to those Nodes go Pending → Running/Ready. kwok reads no
configuration but ours (KWOK_WORKDIR points into the cluster's work directory, so a
~/.kwok/kwok.yaml of the user's is never loaded).

kwok v0.7.0 (v0.8.0 too) starts its Pod and Node controllers in Go map order (controllers
Controller.Start ranges over the stages grouped by resource), and the Pod controller keeps the
read-only check it was built with: built before the Node controller's Lease controller set it, it
has none, and plays every pod of every Node it manages whoever holds the Node's Lease (a crashed
machine's new pods started, its pods Ready again after the node lifecycle controller marked them
not Ready: the first seen in CI, the second fits a CI failure). Which one started first shows in kwok's goroutine numbers, so each kwok
serves its debug endpoint on the cluster's own loopback address, and `start` keeps only a kwok that
started its Node controller first.
"""

from __future__ import annotations

import logging
import os
import re
import urllib.request
from pathlib import Path

from lab.controlplane import free_port
from lab.process import Managed, wait_until

STAGES = Path(__file__).with_name("stages.yaml")
MANAGED_ANNOTATION = "lab.kontinuum.sh/kwok"  # value: the cluster name; kwok manages exactly these Nodes
CNI_READY_ANNOTATION = "lab.kontinuum.sh/cni-ready"  # "true" once the node's Cilium agent pod is Ready
# A kubelet's node Lease lasts 40 s and is renewed every 10 s. kwok renews at a quarter of this
# duration and tries to take a Lease someone else holds (the lab, while a machine is down:
# lab/kubelets.py) only that often, so a started kubelet's Node would wait up to 10 s more for kwok
# to play it: a shorter Lease brings it back within 3 s. The node lifecycle controller reads the
# renewals only, never this duration (lab/controllers.py NODE_MONITOR_GRACE).
LEASE_SECONDS = 12
START_ATTEMPTS = 10  # kwoks started until one started its Node controller first (10 of 12 did, measured)
DEBUG_TIMEOUT = 30.0  # seconds a started kwok has to answer on its debug endpoint
log = logging.getLogger(__name__)


def argv(kubeconfig: Path, *, cluster: str, node_ip: str, pod_cidr: str, server: str,
         stages: Path = STAGES) -> list[str]:
    return [
        "kwok",
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}={cluster}",
        f"--node-ip={node_ip}",  # fallback only: every lab Node carries its own InternalIP
        f"--cidr={pod_cidr}",  # fallback only: every lab Node carries its own podCIDR
        f"--node-lease-duration-seconds={LEASE_SECONDS}",
        f"--server-address={server}",  # /debug/pprof: which controller started first
        "--v=WARN",
    ]


def start(workdir: Path, kubeconfig: Path, *, cluster: str, node_ip: str, pod_cidr: str) -> Managed:
    """Start kwok for one cluster (from the thread that owns the cluster: see lab.process): one
    that honours the Leases (module docstring); another one replaces each that would not."""
    home = Path(workdir) / "kwok"
    home.mkdir(parents=True, exist_ok=True)
    # One P: goroutine ids are then handed out in creation order (Go caches them per P in batches).
    env = dict(os.environ, KWOK_WORKDIR=str(home), GOMAXPROCS="1")
    for attempt in range(1, START_ATTEMPTS + 1):
        server = f"{node_ip}:{free_port(node_ip)}"
        managed = Managed("kwok", argv(kubeconfig, cluster=cluster, node_ip=node_ip, pod_cidr=pod_cidr, server=server),
                          Path(workdir) / "logs" / "kwok.log", env=env).start()
        try:
            first = wait_until(f"kwok of {cluster} answering on {server}", lambda: _first_controller(server),
                               DEBUG_TIMEOUT, on_fail=lambda: _check_alive(managed))
        except BaseException:
            managed.kill()
            raise
        if first == "Node":
            return managed
        log.info("cluster %s: kwok started its Pod controller first (it would ignore Leases); starting another (%d)",
                 cluster, attempt)
        managed.kill()
    raise RuntimeError(f"cluster {cluster}: {START_ATTEMPTS} kwoks in a row started their Pod controller before their "
                       f"Node controller (they would play the pods of Nodes whose Lease the lab holds); see {home}")


def _check_alive(managed: Managed) -> None:
    """Ends the wait at once: a kwok that exited will never answer."""
    if not managed.running():
        raise RuntimeError(f"kwok exited at start; last lines:\n{managed.tail()}")


def _first_controller(server: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://{server}/debug/pprof/goroutine?debug=2", timeout=5) as reply:
            return first_controller(reply.read().decode(errors="replace"))
    except OSError:
        return None  # not serving yet


def first_controller(goroutines: str) -> str | None:
    """"Pod" or "Node": the kwok controller whose watch goroutine was created first (goroutine ids
    grow in creation order), from a Go goroutine dump; None until both run."""
    first: dict[str, int] = {}
    for block in goroutines.split("\n\n"):
        header = re.match(r"goroutine (\d+) ", block)
        kind = re.search(r"controllers\.\(\*(Pod|Node)Controller\)\.watchResources", block)
        if header and kind:
            first[kind.group(1)] = min(first.get(kind.group(1), 1 << 62), int(header.group(1)))
    if len(first) < 2:
        return None
    return min(first, key=first.__getitem__)
