"""The real Flux Operator in the lab, and the minimal chart that stands for its upstream chart.

- module_dir(): the operator's Go module at the pinned version (tools/versions.env), through
  `go mod download` (cached by Go): its CRDs (config/crd/bases) and the Flux distribution
  manifests it installs (config/data, the image's /data; the operator reads them from
  --storage-path, so nothing is pulled from a registry);
- chart_dir(dest): lab/charts/flux-operator assembled with those CRDs in files/crds;
- OperatorRunner: runs the operator binary (tools/install.sh flux-operator) against a zone's
  apiserver while the zone's flux-operator pod (kwok-played) is Running and Ready, as the
  container would; it stops when the pod goes (uninstall) or fails (lab/pod_network.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

from kubernetes import client

from lab.controlplane import free_port
from lab.process import Managed
from lab.standins.loop import REQUEST_TIMEOUT

ROOT = Path(__file__).resolve().parent.parent
CHART_SOURCE = ROOT / "lab" / "charts" / "flux-operator"
MODULE = "github.com/controlplaneio-fluxcd/flux-operator"
POD_SELECTOR = "app.kubernetes.io/name=flux-operator"
DOWNLOAD_TIMEOUT = 300.0  # seconds for `go mod download` (a cold module cache fetches ~30 MB)

log = logging.getLogger(__name__)


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


def _ready(pod: client.V1Pod) -> bool:
    return (not pod.metadata.deletion_timestamp and pod.status.phase == "Running"
            and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []))


class OperatorRunner:
    """The operator process of one zone cluster, started and stopped from the cluster's thread."""

    def __init__(self, workdir: Path, kubeconfig: Path, *, address: str, cluster: str):
        self.workdir, self.kubeconfig, self.address, self.cluster = Path(workdir), Path(kubeconfig), address, cluster
        self.process: Managed | None = None
        self.namespace: str | None = None

    def argv(self) -> list[str]:
        return ["flux-operator", f"--storage-path={data_dir()}", "--enable-leader-election=false",
                f"--metrics-addr={self.address}:{free_port(self.address)}",
                f"--health-addr={self.address}:{free_port(self.address)}",
                "--web-server-port=0", "--log-level=info"]

    def reconcile(self, core: client.CoreV1Api) -> None:
        pods = core.list_pod_for_all_namespaces(label_selector=POD_SELECTOR, _request_timeout=REQUEST_TIMEOUT).items
        running = next((p for p in pods if _ready(p)), None)
        if running is None or (self.namespace and running.metadata.namespace != self.namespace):
            if self.process is not None:
                log.info("cluster %s: flux-operator pod gone or not running; stopping the operator", self.cluster)
                self.stop()
            return
        if self.process is not None and not self.process.running():
            log.warning("cluster %s: flux-operator exited; restarting it. Last lines:\n%s", self.cluster,
                        self.process.tail())
            self.process = None
        if self.process is None:
            self.namespace = running.metadata.namespace
            env = dict(os.environ, KUBECONFIG=str(self.kubeconfig), RUNTIME_NAMESPACE=self.namespace)
            self.process = Managed("flux-operator", self.argv(), self.workdir / "logs" / "flux-operator.log",
                                   env=env).start()
            log.info("cluster %s: flux-operator running for pod %s/%s", self.cluster, self.namespace,
                     running.metadata.name)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.process, self.namespace = None, None
