"""The lab hub: a real kube-apiserver with the kontinuum.sh CRDs, reached through a kubeconfig file.

The hub is just a Kubernetes API (DESIGN §5), so the lab runs etcd + kube-apiserver only: no
controllers, nothing reconciles hub objects but Kontinuum itself. Its CA persists in the work
directory, so stopping and starting the hub again (as `python -m lab down/up` will) keeps both
the data in etcd and the kubeconfig already written into stack config valid.
"""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path

import yaml
from kubernetes import client

from kontinuum.hub import crds as hub_crds
from kontinuum.kube import clients
from kontinuum.talos.pki import CertKey
from lab import crds as lab_crds
from lab.controlplane import ClusterPKI, ControlPlane, free_port

DEFAULT_ADDRESS = "127.0.0.2"
DEFAULT_PORT = 6443
DEFAULT_ETCD_PORTS = (2379, 2380)
NAMESPACE = hub_crds.HUB_NAMESPACE
REQUEST_TIMEOUT = 10.0  # seconds, per API call
KUBECONFIG_FILE = "hub.kubeconfig"
_PKI_FILE = "hub-pki.yaml"

log = logging.getLogger(__name__)


def _save_pki(path: Path, p: ClusterPKI) -> None:
    def pair(ck: CertKey) -> dict:
        return {"crt": base64.b64encode(ck.crt).decode(), "key": base64.b64encode(ck.key).decode()}

    doc = {
        "ca": pair(p.ca),
        "aggregatorCA": pair(p.aggregator_ca),
        "etcdCA": pair(p.etcd_ca),
        "serviceAccountKey": base64.b64encode(p.service_account_key).decode(),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f)


def _load_pki(path: Path) -> ClusterPKI:
    doc = yaml.safe_load(path.read_text())

    def pair(d: dict) -> CertKey:
        return CertKey(base64.b64decode(d["crt"]), base64.b64decode(d["key"]))

    return ClusterPKI(
        ca=pair(doc["ca"]),
        aggregator_ca=pair(doc["aggregatorCA"]),
        etcd_ca=pair(doc["etcdCA"]),
        service_account_key=base64.b64decode(doc["serviceAccountKey"]),
    )


class Hub:
    """One hub apiserver: start() brings it up ready for use, stop() ends exactly its processes."""

    def __init__(
        self,
        workdir: Path,
        *,
        address: str = DEFAULT_ADDRESS,
        port: int = DEFAULT_PORT,
        etcd_ports: tuple[int, int] = DEFAULT_ETCD_PORTS,
        name: str = "hub",
        controllers: bool = True,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig_path = self.workdir / KUBECONFIG_FILE
        pki_path = self.workdir / _PKI_FILE
        if pki_path.exists():
            pki_ = _load_pki(pki_path)
        else:
            pki_ = ClusterPKI.generate()
            _save_pki(pki_path, pki_)
        # With the controller-manager by default, as any real hub: its garbage collector
        # completes the foreground deletions pulumi-kubernetes asks for (hub Secrets of removed
        # zones). Tests that play a controller themselves turn it off.
        self.control_plane = ControlPlane(
            name, self.workdir / "controlplane", pki_, address=address, apiserver_port=port, etcd_ports=etcd_ports,
            controllers=controllers,
        )

    @classmethod
    def on_free_ports(cls, workdir: Path, address: str, **options) -> "Hub":
        """A hub on `address` whose apiserver and etcd take free ports there (tests run several)."""
        return cls(workdir, address=address, port=free_port(address),
                   etcd_ports=(free_port(address), free_port(address)), **options)

    @property
    def server(self) -> str:
        return self.control_plane.server

    @property
    def kubeconfig(self) -> str:
        return self.kubeconfig_path.read_text()

    def api_client(self) -> client.ApiClient:
        return clients.api_client(self.kubeconfig)

    def start(self, timeout: float = 120.0) -> "Hub":
        """Start the apiserver, install and await our CRDs, create the hub namespace, write the kubeconfig."""
        self.control_plane.start()
        try:
            self._write_kubeconfig()
            with self.api_client() as api:
                lab_crds.apply(api, hub_crds.manifests(), timeout=timeout)
                self._ensure_namespace(api)
        except BaseException:
            self.stop()
            raise
        log.info("hub ready at %s; kubeconfig %s", self.server, self.kubeconfig_path)
        return self

    def _write_kubeconfig(self) -> None:
        fd = os.open(self.kubeconfig_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.control_plane.admin_kubeconfig())

    def _ensure_namespace(self, api: client.ApiClient) -> None:
        try:
            client.CoreV1Api(api).create_namespace(
                {"metadata": {"name": NAMESPACE}}, _request_timeout=REQUEST_TIMEOUT
            )
        except client.ApiException as e:
            if e.status != 409:
                raise

    def running(self) -> bool:
        return self.control_plane.running()

    def stop(self) -> None:
        self.control_plane.stop()

    def remove(self) -> None:
        """Stop and delete the work directory (etcd data, CA, kubeconfig)."""
        self.stop()
        self.control_plane.remove()
        for f in (self.kubeconfig_path, self.workdir / _PKI_FILE):
            f.unlink(missing_ok=True)

    def __enter__(self) -> "Hub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
