"""kwok plays the kubelets of one emulated cluster: one kwok process per cluster control plane.

kwok manages only the Nodes the lab registers (they carry MANAGED_ANNOTATION with the cluster's
name), renews their Leases (a machine that left has its Lease held by the lab instead:
lab/kubelets.py), and walks Nodes and Pods through our own stages (stages.yaml):
Nodes stay NotReady with the kubelet's "network plugin not ready" until the lab sets
CNI_READY_ANNOTATION, Pods bound to those Nodes go Pending → Running/Ready. kwok serves no HTTP
endpoint here (no --server-address, no --node-port), so it binds no port at all, and it reads no
configuration but ours (KWOK_WORKDIR points into the cluster's work directory, so a
~/.kwok/kwok.yaml of the user's is never loaded).
"""

from __future__ import annotations

import os
from pathlib import Path

from lab.process import Managed

STAGES = Path(__file__).with_name("stages.yaml")
MANAGED_ANNOTATION = "lab.kontinuum.sh/kwok"  # value: the cluster name; kwok manages exactly these Nodes
CNI_READY_ANNOTATION = "lab.kontinuum.sh/cni-ready"  # "true" once the node's Cilium agent pod is Ready
# A kubelet's node Lease lasts 40 s and is renewed every 10 s. kwok renews at a quarter of this
# duration and tries to take a Lease someone else holds (the lab, while a machine is down:
# lab/kubelets.py) only that often, so a started kubelet's Node would wait up to 10 s more for kwok
# to play it: a shorter Lease brings it back within 3 s. The node lifecycle controller reads the
# renewals only, never this duration (lab/controllers.py NODE_MONITOR_GRACE).
LEASE_SECONDS = 12


def argv(kubeconfig: Path, *, cluster: str, node_ip: str, pod_cidr: str, stages: Path = STAGES) -> list[str]:
    return [
        "kwok",
        f"--kubeconfig={kubeconfig}",
        f"--config={stages}",
        f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}={cluster}",
        f"--node-ip={node_ip}",  # fallback only: every lab Node carries its own InternalIP
        f"--cidr={pod_cidr}",  # fallback only: every lab Node carries its own podCIDR
        f"--node-lease-duration-seconds={LEASE_SECONDS}",
        "--v=WARN",
    ]


def start(workdir: Path, kubeconfig: Path, *, cluster: str, node_ip: str, pod_cidr: str) -> Managed:
    """Start kwok for one cluster (from the thread that owns the cluster: see lab.process)."""
    home = Path(workdir) / "kwok"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, KWOK_WORKDIR=str(home))
    return Managed(
        "kwok", argv(kubeconfig, cluster=cluster, node_ip=node_ip, pod_cidr=pod_cidr),
        Path(workdir) / "logs" / "kwok.log", env=env,
    ).start()
