"""Flux's own source-controller and kustomize-controller in the lab (tools/install.sh builds them
from their Go modules at the release the pinned Flux Operator ships: FLUX_CONTROLLERS_VERSION).

Each runs as a process while its pod (kwok-played, installed by the real Flux Operator from its
distribution manifests) is Ready, reaching the API as the pod would (lab/pod_processes.py). The
source-controller serves its artifacts over HTTP on the cluster's address; it advertises that
address, so the kustomize-controller downloads them from it as from the source-controller
Service. Git is fetched for real (lab/git_server.py over HTTP, lab/git_ssh_server.py over SSH)
and the kustomize-controller applies the built objects with server-side apply.
"""

from __future__ import annotations

from pathlib import Path

from lab.controlplane import free_port
from lab.pod_processes import PodNetwork, PodProcess

COMMON = ["--enable-leader-election=false", "--watch-all-namespaces=true", "--events-addr=", "--log-level=info",
          "--log-encoding=json"]


def runners(workdir: Path, network: PodNetwork, *, address: str, cluster: str) -> list[PodProcess]:
    storage = Path(workdir) / "pods" / "source-controller" / "data"
    storage_addr = f"{address}:{free_port(address)}"  # fixed for the runner: artifacts' URLs stay valid

    def source(pod: dict) -> list[str]:
        storage.mkdir(parents=True, exist_ok=True)
        return ["source-controller", f"--storage-path={storage}", f"--storage-addr={storage_addr}",
                f"--storage-adv-addr={storage_addr}", *_ports(address), *COMMON]

    def kustomize(pod: dict) -> list[str]:
        return ["kustomize-controller", *_ports(address), *COMMON]

    return [PodProcess("source-controller", "app=source-controller", workdir, source, cluster=cluster, network=network),
            PodProcess("kustomize-controller", "app=kustomize-controller", workdir, kustomize, cluster=cluster,
                       network=network)]


def _ports(address: str) -> list[str]:
    return [f"--metrics-addr={address}:{free_port(address)}", f"--health-addr={address}:{free_port(address)}"]
