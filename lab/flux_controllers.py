"""Flux's own source-controller, kustomize-controller and notification-controller in the lab
(tools/install.sh builds them from their Go modules at the releases the pinned Flux Operator ships:
FLUX_CONTROLLERS_VERSION, FLUX_NOTIFICATION_CONTROLLER_VERSION).

Each runs as a process while its pod (kwok-played, installed by the real Flux Operator from its
distribution manifests) is Ready, reaching the API as the pod would (lab/pod_processes.py). The
source-controller serves its artifacts over HTTP on the cluster's address; it advertises that
address, so the kustomize-controller downloads them from it as from the source-controller
Service. Git is fetched for real (lab/git_server.py over HTTP, lab/git_ssh_server.py over SSH)
and the kustomize-controller applies the built objects with server-side apply. The
notification-controller takes events on the cluster's address (`events_url`, what the
notification-controller Service stands for: nothing answers there while no process runs) from the
Flux Operator, which names it by the cluster DNS name the lab has no resolver for
(lab/flux_operator.py); the two controllers here keep their events to themselves (`--events-addr=`).
"""

from __future__ import annotations

from pathlib import Path

from lab.controlplane import free_port
from lab.pod_processes import PodNetwork, PodProcess

COMMON = ["--enable-leader-election=false", "--watch-all-namespaces=true", "--log-level=info", "--log-encoding=json"]
QUIET = "--events-addr="  # no events sent


def events_address(address: str) -> str:
    """Where the zone's notification-controller takes events (fixed for the cluster's runners)."""
    return f"{address}:{free_port(address)}"


def events_url(events: str) -> str:
    return f"http://{events}/"


def runners(workdir: Path, network: PodNetwork, *, address: str, cluster: str, events: str) -> list[PodProcess]:
    storage = Path(workdir) / "pods" / "source-controller" / "data"
    storage_addr = f"{address}:{free_port(address)}"  # fixed for the runner: artifacts' URLs stay valid

    def source(pod: dict) -> list[str]:
        storage.mkdir(parents=True, exist_ok=True)
        return ["source-controller", f"--storage-path={storage}", f"--storage-addr={storage_addr}",
                f"--storage-adv-addr={storage_addr}", *_ports(address), QUIET, *COMMON]

    def kustomize(pod: dict) -> list[str]:
        return ["kustomize-controller", *_ports(address), QUIET, *COMMON]

    def notification(pod: dict) -> list[str]:
        return ["notification-controller", f"--events-addr={events}", f"--receiverAddr={address}:{free_port(address)}",
                *_ports(address), *COMMON]

    return [PodProcess("source-controller", "app=source-controller", workdir, source, cluster=cluster, network=network),
            PodProcess("kustomize-controller", "app=kustomize-controller", workdir, kustomize, cluster=cluster,
                       network=network),
            PodProcess("notification-controller", "app=notification-controller", workdir, notification,
                       cluster=cluster, network=network)]


def _ports(address: str) -> list[str]:
    return [f"--metrics-addr={address}:{free_port(address)}", f"--health-addr={address}:{free_port(address)}"]
