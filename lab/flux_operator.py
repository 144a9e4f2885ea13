"""The real Flux Operator in the lab, and the minimal chart that stands for its upstream chart.

- module_dir(): the operator's Go module at the pinned version (tools/versions.env), through
  `go mod download` (cached by Go): its CRDs (config/crd/bases) and the Flux distribution
  manifests it installs (config/data, the image's /data; the operator reads them from
  --storage-path, so nothing is pulled from a registry);
- chart_dir(dest): lab/charts/flux-operator assembled with those CRDs in files/crds;
- runner(): the operator binary (tools/install.sh flux-operator) run against a zone's apiserver
  while the zone's flux-operator pod (kwok-played) is Running and Ready, reaching the API at the
  address the pod's own environment names (lab/pod_processes.py, lab/pod_api.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from lab.controlplane import free_port
from lab.pod_processes import PodNetwork, PodProcess

ROOT = Path(__file__).resolve().parent.parent
CHART_SOURCE = ROOT / "lab" / "charts" / "flux-operator"
MODULE = "github.com/controlplaneio-fluxcd/flux-operator"
POD_SELECTOR = "app.kubernetes.io/name=flux-operator"
DOWNLOAD_TIMEOUT = 300.0  # seconds for `go mod download` (a cold module cache fetches ~30 MB)


def pinned_version() -> str:
    text = (ROOT / "tools" / "versions.env").read_text()
    return re.search(r"^FLUX_OPERATOR_VERSION=(\S+)$", text, re.M).group(1)


_module: dict[str, Path] = {}


def module_dir(version: str | None = None) -> Path:
    """The operator's module source (read-only, in Go's module cache)."""
    version = version or pinned_version()
    if version not in _module:
        env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
        out = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@{version}"], capture_output=True,
                             text=True, timeout=DOWNLOAD_TIMEOUT, env=env, cwd="/")
        info = json.loads(out.stdout or "{}")
        if out.returncode != 0 or "Dir" not in info:
            raise RuntimeError(f"cannot read the Flux Operator module {MODULE}@{version}: "
                               f"{info.get('Error') or out.stderr.strip()}")
        _module[version] = Path(info["Dir"])
    return _module[version]


def crd_files(version: str | None = None) -> list[Path]:
    return sorted((module_dir(version) / "config" / "crd" / "bases").glob("*.yaml"))


def data_dir(version: str | None = None) -> Path:
    """The distribution manifests the operator installs (its image's /data)."""
    return module_dir(version) / "config" / "data"


def chart_dir(dest: Path, version: str | None = None) -> Path:
    """lab/charts/flux-operator plus the real operator's CRDs, assembled at `dest` (replaced)."""
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(CHART_SOURCE, tmp)
    (tmp / "files" / "crds").mkdir(parents=True)
    for crd in crd_files(version):
        shutil.copyfile(crd, tmp / "files" / "crds" / crd.name)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def runner(workdir: Path, network: PodNetwork, *, address: str, cluster: str, events_url: str) -> PodProcess:
    """The operator's process for the zone's flux-operator pod (lab/pod_processes.py). It sends
    its events to notification-controller.<namespace>.svc.<cluster domain>; the lab has no cluster
    DNS (and must not ask the machine's resolver), so it names the notification-controller's lab
    address in the operator's own override, NOTIFICATION_CONTROLLER_ADDRESS."""
    def argv(pod: dict) -> list[str]:
        return ["flux-operator", f"--storage-path={data_dir()}", "--enable-leader-election=false",
                f"--metrics-addr={address}:{free_port(address)}", f"--health-addr={address}:{free_port(address)}",
                "--web-server-port=0", "--log-level=info"]
    return PodProcess("flux-operator", POD_SELECTOR, workdir, argv, cluster=cluster, network=network,
                      env=lambda pod: {"NOTIFICATION_CONTROLLER_ADDRESS": events_url})
