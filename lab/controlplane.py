"""A real Kubernetes control plane (etcd, kube-apiserver, optionally controller-manager and
scheduler) on one loopback address, from a cluster's own CAs.

Used by the tests (a throwaway apiserver for the hub or a Pulumi e2e stack) and by the lab,
which feeds it the CAs from an emulated cluster's applied machine config so the kubeconfig
that cluster's Talos API hands out works unchanged.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization

from kontinuum.talos import pki
from kontinuum.talos.pki import CertKey
from lab import controllers, etcd_restore
from lab.apiservers import Apiserver, ServingNames, readyz, repair_failed, serving_cert
from lab.apiservers import argv as apiserver_argv
from lab.apiservers import files as apiserver_files
from lab.process import Managed, wait_until

STOP_GRACE = 3.0  # seconds a stopping apiserver gets before SIGKILL (the runner's tick waits for it)
READY_TIMEOUT = 90.0  # seconds for etcd + apiserver /readyz on a loaded 2-core machine


class _Doomed(Exception):
    """A restarted apiserver's first Service repair failed: it will exit within a minute."""


@dataclass(frozen=True)
class ClusterPKI:
    """The CAs and keys one Kubernetes control plane is built from."""

    ca: CertKey
    aggregator_ca: CertKey
    etcd_ca: CertKey
    service_account_key: bytes
    accepted_cas: bytes = b""  # cluster.acceptedCAs: further client CAs (a CA rotation's)

    @classmethod
    def generate(cls) -> "ClusterPKI":
        return cls(
            ca=pki.new_ca(organizations=["kubernetes"]),
            aggregator_ca=pki.new_ca(common_name="front-proxy"),
            etcd_ca=pki.new_ca(organizations=["etcd"]),
            service_account_key=pki.talos_key_pem(pki.new_key("ecdsa")),
        )


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _check_loopback(address: str) -> None:
    if not ipaddress.ip_address(address).is_loopback:
        raise ValueError(f"control plane address {address}: the lab only binds 127.0.0.0/8")


def kubeconfig_text(name: str, server: str, ca_crt: bytes, client: CertKey) -> str:
    """Admin kubeconfig in the layout Talos generates (config facts §3)."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    user = f"admin@{name}"
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca_crt)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(client.crt),
                                          "client-key-data": b64(pki.to_standard_pem(client.key))}}],
        "contexts": [{"name": user, "context": {"cluster": name, "namespace": "default", "user": user}}],
        "current-context": user,
    }, sort_keys=False)


class ControlPlane:
    """etcd + kube-apiserver (+ controller-manager + scheduler) bound to one address, and, for an
    emulated cluster with several control planes, one more kube-apiserver per further control
    plane address against the same etcd (start_apiserver; lab/cluster_apiservers.py decides)."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        pki_: ClusterPKI,
        *,
        address: str = "127.0.0.1",
        apiserver_port: int = 6443,
        etcd_ports: tuple[int, int] = (2379, 2380),
        controllers: bool = False,
        controller_ports: tuple[int, int] = (10257, 10259),
        service_cidr: str = "10.96.0.0/12",
        pod_cidr: str = "10.244.0.0/16",
        env: dict[str, str] | None = None,
        egress_selector: str | None = None,
        restore_from: bytes | None = None,
        skip_hash_check: bool = False,
        hostname: str | None = None,
        names: ServingNames = ServingNames(),
        clients_via: str | None = None,
    ):
        """restore_from: an etcd snapshot that etcd starts from (etcdutl snapshot restore), as
        Talos's Bootstrap(recover_etcd) does; skip_hash_check as its recover_skip_hash_check.
        hostname, names: what the serving certificates name (lab/apiservers.py). clients_via: a
        URL in front of every apiserver (a TCP proxy) that the controller-manager, the scheduler
        and lab_kubeconfig() use instead of this address's apiserver, verified as localhost."""
        _check_loopback(address)
        self.egress_selector = egress_selector  # EgressSelectorConfiguration YAML (lab/service_proxy.py)
        self.name = name
        self.workdir = Path(workdir)
        self.pki = pki_
        self.address = address
        self.apiserver_port = apiserver_port
        self.etcd_ports = etcd_ports
        self.controllers = controllers
        self.controller_ports = controller_ports
        self.service_cidr = service_cidr
        self.pod_cidr = pod_cidr
        self.env = env
        self.restore_from = restore_from
        self.skip_hash_check = skip_hash_check
        self.hostname = hostname
        self.names = names
        self.clients_via = clients_via
        self.etcd: Managed | None = None
        self.apiservers: dict[str, Apiserver] = {}  # address -> the apiserver running there
        self.controller_processes: list[Managed] = []
        # The lab's own clients (kwok, stand-ins, the health probe) authenticate with this CA, which
        # the apiserver always accepts: like kubelets that Talos restarts with new certificates,
        # they keep working across a rotation of the cluster CA without being restarted.
        self.lab_ca = pki.new_ca(common_name="kontinuum-lab-clients", days=30)
        self._generation = 0  # bumped by every restart on new CAs; its files and logs go apart
        self._probe_client: tuple[str, str] | None = None

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.apiserver_port}"

    @property
    def processes(self) -> list[Managed]:
        """Every process this control plane runs now: etcd, the apiservers, the controllers."""
        return [*([self.etcd] if self.etcd else []), *(a.process for a in list(self.apiservers.values())),
                *self.controller_processes]

    def admin_kubeconfig(self) -> str:
        client = pki.issue_cert(
            self.pki.ca, common_name="admin", organizations=["system:masters"], client=True, key_type="ecdsa"
        )
        return kubeconfig_text(self.name, self.server, self.pki.ca.crt, client)

    def lab_kubeconfig(self) -> str:
        """The lab's own admin identity for an emulated cluster (see lab_ca): it keeps working
        across a rotation of the cluster CA, so it trusts the serving certificate by address on
        loopback, whichever cluster CA issues it. Through clients_via when given."""
        client = pki.issue_cert(
            self.lab_ca, common_name="lab-admin", organizations=["system:masters"], client=True, key_type="ecdsa"
        )
        doc = yaml.safe_load(kubeconfig_text(self.name, self.clients_via or self.server, self.pki.ca.crt, client))
        cluster = doc["clusters"][0]["cluster"]
        cluster.pop("certificate-authority-data")
        cluster["insecure-skip-tls-verify"] = True
        return yaml.safe_dump(doc, sort_keys=False)

    # -- files ------------------------------------------------------------------------

    def _write(self, rel: str, data: bytes | str) -> str:
        """Write a file the processes read, atomically: a running one may read it right now."""
        path = self.workdir / "pki" / (f"rotated-{self._generation}" if self._generation else "") / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
        return str(path)

    def _pair(self, rel: str, ck: CertKey) -> tuple[str, str]:
        return self._write(rel + ".crt", ck.crt), self._write(rel + ".key", pki.to_standard_pem(ck.key))

    def _component_kubeconfig(self, user: str, org: str | None) -> str:
        client = pki.issue_cert(
            self.pki.ca, common_name=user, organizations=[org] if org else [], client=True, key_type="ecdsa"
        )
        doc = yaml.safe_load(kubeconfig_text(self.name, self.clients_via or self.server, self.pki.ca.crt, client))
        if self.clients_via:  # whichever apiserver answers, its certificate names localhost
            doc["clusters"][0]["cluster"]["tls-server-name"] = "localhost"
        return self._write(f"{user.replace(':', '-')}.kubeconfig", yaml.safe_dump(doc, sort_keys=False))

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT) -> "ControlPlane":
        try:
            self._start_etcd()
            self.start_apiserver(self.address, hostname=self.hostname)
            wait_until(f"{self.name}: kube-apiserver {self.server}/readyz", lambda: self.apiserver_ready(self.address),
                       timeout, on_fail=self._check_alive)
            if self.controllers:
                self._start_controllers()
        except BaseException:
            self.stop()
            raise
        return self

    def start_apiserver(self, address: str, *, hostname: str | None = None, tag: object = None) -> Apiserver:
        """Start a kube-apiserver at `address` (on the apiserver port, against this etcd) without
        waiting for it: apiserver_ready() tells when it serves."""
        _check_loopback(address)
        if address in self.apiservers:
            raise RuntimeError(f"{self.name}: a kube-apiserver already runs at {address}")
        self.apiservers[address] = server = self._spawn_apiserver(address, hostname, tag)
        return server

    def stop_apiserver(self, address: str, *, kill: bool = False) -> None:
        """Stop the apiserver at `address`: SIGTERM (a reboot stops its pods), or SIGKILL (the
        power went). Either way its port refuses once this returns."""
        server = self.apiservers.pop(address, None)
        if server is not None:
            server.process.kill() if kill else server.process.stop(grace=STOP_GRACE)

    def apiserver_ready(self, address: str) -> bool:
        """Whether the apiserver at `address` runs and answered /readyz ok (probed until it did)."""
        server = self.apiservers.get(address)
        if server is None or not server.process.running():
            return False
        if not server.ready:
            server.ready = readyz(server, self.apiserver_port, self._probe_pair())
        return server.ready

    def serving(self) -> list[tuple[str, int]]:
        """(address, port) of each apiserver that is up: where a load balancer may send a client."""
        return [(a.address, self.apiserver_port) for a in list(self.apiservers.values()) if a.up]

    def restart_with(self, pki_: ClusterPKI, timeout: float = READY_TIMEOUT) -> None:
        """Restart every apiserver, then the controller-manager and scheduler (etcd keeps running),
        on new cluster CAs, as Talos restarts the control-plane pods when cluster.ca or
        cluster.acceptedCAs change. Rolling, as behind a load balancer: one apiserver at a time,
        the new one sharing its port (SO_REUSEPORT) until it is ready, then the old one stops, so
        the API answers throughout. A new apiserver doomed by its first Service repair is replaced at
        once (lab.apiservers.repair_failed); one that dies or never gets ready is stopped and the old
        one keeps serving on the old CAs; the caller tries again (as the kubelet restarts a crashed
        pod), and apiservers that moved already are not restarted twice."""
        before = self.pki
        self.pki = pki_
        self._generation += 1
        try:
            for server in list(self.apiservers.values()):
                if server.pki != pki_:
                    self._roll(server, timeout)
        except BaseException:
            self.pki = before
            raise
        for p in self.controller_processes:
            p.stop()
        self.controller_processes.clear()
        if self.controllers:
            self._start_controllers()

    def _roll(self, old: Apiserver, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:  # a new apiserver doomed by its first repair is started again, as the kubelet would
            started = self._spawn_apiserver(old.address, old.hostname, old.tag)
            try:
                if self._wait_restarted(started, deadline):
                    break
            except BaseException:
                started.process.stop()
                raise
            started.process.stop()
        started.ready = True
        old.process.stop()
        if self.apiservers.get(old.address) is old:
            self.apiservers[old.address] = started
        else:  # stopped meanwhile (its machine went down): the new one goes too
            started.process.stop()

    def _wait_restarted(self, started: Apiserver, deadline: float) -> bool:
        """True once the restarted apiserver is ready; False if its first repair failed and time
        is left to start another (lab.apiservers.repair_failed)."""
        url = f"https://{started.address}:{self.apiserver_port}"

        def alive() -> None:  # only the new apiserver counts: the old one may have ended on its own
            if not started.process.running():
                raise RuntimeError(f"{self.name}: the restarted kube-apiserver at {started.address} exited early; "
                                   f"last log lines:\n{started.process.tail()}")
            if repair_failed(started) and time.monotonic() < deadline:
                raise _Doomed()

        try:
            wait_until(f"{self.name}: the restarted kube-apiserver {url}/readyz",
                       lambda: readyz(started, self.apiserver_port, self._probe_pair(), attempts=8),
                       max(deadline - time.monotonic(), 1.0), on_fail=alive)
        except _Doomed:
            return False
        return True

    def _probe_pair(self) -> tuple[str, str]:
        if self._probe_client is None:
            self._probe_client = self._pair("readyz-probe", pki.issue_cert(
                self.lab_ca, common_name="readyz-probe", organizations=["system:masters"], client=True,
                key_type="ecdsa"))
        return self._probe_client

    def _spawn(self, name: str, argv: list[str], log_name: str | None = None) -> Managed:
        env = dict(os.environ if self.env is None else self.env)
        stem = log_name or name
        log = f"{stem}-{self._generation}.log" if self._generation else f"{stem}.log"
        return Managed(name, argv, self.workdir / "logs" / log, env=env).start()

    def _check_alive(self) -> None:
        for p in self.processes:
            if not p.running():
                raise RuntimeError(f"{self.name}: {p.name} exited early; last log lines:\n{p.tail()}")

    def _start_etcd(self) -> None:
        a = self.address
        client, peer = self.etcd_ports
        ca = self._write("etcd/ca.crt", self.pki.etcd_ca.crt)
        crt, key = self._pair(
            "etcd/server",
            pki.issue_cert(self.pki.etcd_ca, common_name="etcd", ip_addresses=[a], dns_names=["localhost"],
                           server=True, client=True, key_type="ecdsa"),
        )
        data = self.workdir / "etcd"
        if self.restore_from is not None and not data.exists():
            etcd_restore.restore(self.restore_from, data, name=self.name, peer_url=f"http://{a}:{peer}",
                                 workdir=self.workdir, skip_hash_check=self.skip_hash_check,
                                 env=dict(os.environ if self.env is None else self.env))
        data.mkdir(parents=True, exist_ok=True)
        data.chmod(0o700)
        self.etcd = self._spawn("etcd", [
            "etcd", "--name", self.name, "--data-dir", str(data),
            "--listen-client-urls", f"https://{a}:{client}", "--advertise-client-urls", f"https://{a}:{client}",
            "--listen-peer-urls", f"http://{a}:{peer}", "--initial-advertise-peer-urls", f"http://{a}:{peer}",
            "--initial-cluster", f"{self.name}=http://{a}:{peer}", "--listen-metrics-urls", "",
            "--cert-file", crt, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(256 * 1024 * 1024), "--log-level", "warn",
        ])

    def _spawn_apiserver(self, address: str, hostname: str | None, tag: object) -> Apiserver:
        serving = serving_cert(self.pki.ca, address, hostname, self.names, self.service_cidr)
        crt, key = self._pair(f"apiserver-{address}", serving)
        files = apiserver_files(self._write, self._pair, self.pki, self.lab_ca.crt)
        egress = self._write("egress-selector.yaml", self.egress_selector) if self.egress_selector else None
        argv = apiserver_argv(address, self.apiserver_port, f"https://{self.address}:{self.etcd_ports[0]}",
                              {**files, "crt": crt, "key": key}, self.service_cidr, egress)
        log_name = "kube-apiserver" if address == self.address else f"kube-apiserver-{address}"
        process = self._spawn("kube-apiserver", argv, log_name)
        der = pki.load_certificate(serving.crt).public_bytes(serialization.Encoding.DER)
        return Apiserver(address, process, der, self.pki.ca.crt, self.pki, hostname, tag)

    def _start_controllers(self) -> None:
        """One controller-manager and one scheduler, however many apiservers run: on Talos each
        control plane runs both, leader-elected, so one of each is active at a time; running that
        one alone (through clients_via, to an apiserver that is up) is what the cluster sees."""
        ca = self._write("ca.crt", self.pki.ca.crt)
        ca_key = self._write("ca.key", pki.to_standard_pem(self.pki.ca.key))
        sa_key = self._write("sa.key", pki.to_standard_pem(self.pki.service_account_key))
        cm = self._component_kubeconfig("system:kube-controller-manager", None)
        self.controller_processes.append(self._spawn("kube-controller-manager", controllers.controller_manager_argv(
            address=self.address, port=self.controller_ports[0], kubeconfig=cm, ca=ca, ca_key=ca_key, sa_key=sa_key,
            pod_cidr=self.pod_cidr, service_cidr=self.service_cidr)))
        sched = self._component_kubeconfig("system:kube-scheduler", None)
        self.controller_processes.append(self._spawn("kube-scheduler", controllers.scheduler_argv(
            address=self.address, port=self.controller_ports[1], kubeconfig=sched)))

    def etcd_snapshot(self, timeout: float = 60.0) -> bytes:
        """etcd's own snapshot (database + sha256 trailer), read as a client would."""
        client = self._pair("etcd-snapshot-client", pki.issue_cert(
            self.pki.etcd_ca, common_name="etcd-snapshot", client=True, key_type="ecdsa"))
        return etcd_restore.snapshot(f"https://{self.address}:{self.etcd_ports[0]}", self.pki.etcd_ca.crt, client,
                                     timeout=timeout)

    def running(self) -> bool:
        return bool(self.processes) and all(p.running() for p in self.processes)

    def stop(self) -> None:
        """Stop exactly the processes this control plane started, newest first."""
        for p in reversed(self.processes):
            p.stop()
        self.controller_processes.clear()
        self.apiservers.clear()
        self.etcd = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
