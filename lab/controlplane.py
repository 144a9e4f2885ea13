"""A real Kubernetes control plane (etcd, kube-apiserver, optionally controller-manager and
scheduler) on one loopback address, from a cluster's own CAs.

Used by the tests (a throwaway apiserver for the hub or a Pulumi e2e stack) and by the lab,
which feeds it the CAs from an emulated cluster's applied machine config so the kubeconfig
that cluster's Talos API hands out works unchanged.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import ssl
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization

from kontinuum.talos import pki
from kontinuum.talos.pki import CertKey
from lab import etcd_restore
from lab.process import Managed, wait_until

READY_TIMEOUT = 90.0  # seconds for etcd + apiserver /readyz on a loaded 2-core machine
NODE_MONITOR_GRACE = 24  # seconds without a Lease renewal before a Node is Unknown (kwok renews every 3 s)


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
    import base64

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    user = f"admin@{name}"
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca_crt)}}],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(client.crt),
                        "client-key-data": b64(pki.to_standard_pem(client.key)),
                    },
                }
            ],
            "contexts": [{"name": user, "context": {"cluster": name, "namespace": "default", "user": user}}],
            "current-context": user,
        },
        sort_keys=False,
    )


class ControlPlane:
    """etcd + kube-apiserver (+ controller-manager + scheduler) bound to one address."""

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
    ):
        """restore_from: an etcd snapshot that etcd starts from (etcdutl snapshot restore), as
        Talos's Bootstrap(recover_etcd) does; skip_hash_check as its recover_skip_hash_check."""
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
        self.processes: list[Managed] = []
        self._probe_ctx: ssl.SSLContext | None = None
        # The lab's own clients (kwok, stand-ins, the health probe) authenticate with this CA, which
        # the apiserver always accepts: like kubelets that Talos restarts with new certificates,
        # they keep working across a rotation of the cluster CA without being restarted.
        self.lab_ca = pki.new_ca(common_name="kontinuum-lab-clients", days=30)
        self._generation = 0  # bumped by every restart on new CAs; its files and logs go apart
        self._serving_der = b""

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.apiserver_port}"

    def admin_kubeconfig(self) -> str:
        client = pki.issue_cert(
            self.pki.ca, common_name="admin", organizations=["system:masters"], client=True, key_type="ecdsa"
        )
        return kubeconfig_text(self.name, self.server, self.pki.ca.crt, client)

    def lab_kubeconfig(self) -> str:
        """The lab's own admin identity for an emulated cluster (see lab_ca): it keeps working
        across a rotation of the cluster CA, so it trusts the serving certificate by address on
        loopback, whichever cluster CA issues it."""
        client = pki.issue_cert(
            self.lab_ca, common_name="lab-admin", organizations=["system:masters"], client=True, key_type="ecdsa"
        )
        doc = yaml.safe_load(kubeconfig_text(self.name, self.server, self.pki.ca.crt, client))
        cluster = doc["clusters"][0]["cluster"]
        cluster.pop("certificate-authority-data")
        cluster["insecure-skip-tls-verify"] = True
        return yaml.safe_dump(doc, sort_keys=False)

    # -- files ------------------------------------------------------------------------

    def _write(self, rel: str, data: bytes | str) -> str:
        path = self.workdir / "pki" / (f"rotated-{self._generation}" if self._generation else "") / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        path.chmod(0o600)
        return str(path)

    def _pair(self, rel: str, ck: CertKey) -> tuple[str, str]:
        return self._write(rel + ".crt", ck.crt), self._write(rel + ".key", pki.to_standard_pem(ck.key))

    def _component_kubeconfig(self, user: str, org: str | None) -> str:
        client = pki.issue_cert(
            self.pki.ca, common_name=user, organizations=[org] if org else [], client=True, key_type="ecdsa"
        )
        return self._write(f"{user.replace(':', '-')}.kubeconfig", kubeconfig_text(self.name, self.server, self.pki.ca.crt, client))

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT) -> "ControlPlane":
        try:
            self._start_etcd()
            self._start_apiserver()
            wait_until(f"{self.name}: kube-apiserver {self.server}/readyz", self._ready, timeout, on_fail=self._check_alive)
            if self.controllers:
                self._start_controllers()
        except BaseException:
            self.stop()
            raise
        return self

    def restart_with(self, pki_: ClusterPKI, timeout: float = READY_TIMEOUT) -> None:
        """Restart the apiserver, controller-manager and scheduler (etcd keeps running) on new
        cluster CAs, as Talos restarts the control-plane pods when cluster.ca or
        cluster.acceptedCAs change. Rolling, as behind a load balancer: the new apiserver shares
        the port (SO_REUSEPORT) until it is ready, then the old one stops, so the API answers
        throughout. A new apiserver that dies or never gets ready is stopped and the old one keeps
        serving on the old CAs; the caller tries again (as the kubelet restarts a crashed pod)."""
        old = [p for p in self.processes if p.name != "etcd"]
        before = (self.pki, self._probe_ctx, self._serving_der)
        self.pki, self._probe_ctx = pki_, None
        self._generation += 1
        self._start_apiserver()
        started = self.processes[-1]

        def alive() -> None:  # only the new apiserver counts: an old component may have ended on its own
            if not started.running():
                raise RuntimeError(f"{self.name}: the restarted kube-apiserver exited early; last log lines:\n"
                                   f"{started.tail()}")

        try:
            wait_until(f"{self.name}: the restarted kube-apiserver {self.server}/readyz", self._new_ready, timeout,
                       on_fail=alive)
        except BaseException:
            started.stop()
            self.processes.remove(started)
            self.pki, self._probe_ctx, self._serving_der = before
            raise
        for p in old:
            p.stop()
            self.processes.remove(p)
        if self.controllers:
            self._start_controllers()

    def _new_ready(self) -> bool:
        """/readyz answered by the apiserver that serves the newest certificate (the port is shared)."""
        ctx = ssl.create_default_context(cadata=self.pki.ca.crt.decode())
        ctx.load_cert_chain(*self._pair("readyz-probe", pki.issue_cert(
            self.pki.ca, common_name="readyz-probe", organizations=["system:masters"], client=True, key_type="ecdsa")))
        for _ in range(8):  # connections spread over both listeners
            with socket.create_connection((self.address, self.apiserver_port), timeout=5) as raw, \
                    ctx.wrap_socket(raw, server_hostname=self.address) as tls:
                if tls.getpeercert(binary_form=True) != self._serving_der:
                    continue
                tls.sendall(f"GET /readyz HTTP/1.1\r\nHost: {self.address}\r\nConnection: close\r\n\r\n".encode())
                reply = b""
                while chunk := tls.recv(4096):
                    reply += chunk
                return reply.startswith(b"HTTP/1.1 200")
        return False

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = dict(os.environ if self.env is None else self.env)
        log = f"{name}-{self._generation}.log" if self._generation else f"{name}.log"
        self.processes.append(Managed(name, argv, self.workdir / "logs" / log, env=env).start())

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
        self._spawn("etcd", [
            "etcd", "--name", self.name, "--data-dir", str(data),
            "--listen-client-urls", f"https://{a}:{client}", "--advertise-client-urls", f"https://{a}:{client}",
            "--listen-peer-urls", f"http://{a}:{peer}", "--initial-advertise-peer-urls", f"http://{a}:{peer}",
            "--initial-cluster", f"{self.name}=http://{a}:{peer}", "--listen-metrics-urls", "",
            "--cert-file", crt, "--key-file", key, "--trusted-ca-file", ca, "--client-cert-auth",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(256 * 1024 * 1024), "--log-level", "warn",
        ])

    def _start_apiserver(self) -> None:
        a = self.address
        etcd_ca = self._write("etcd/ca.crt", self.pki.etcd_ca.crt)
        etcd_crt, etcd_key = self._pair(
            "apiserver-etcd-client",
            pki.issue_cert(self.pki.etcd_ca, common_name="kube-apiserver", client=True, key_type="ecdsa"),
        )
        client_cas = self._write("client-ca.crt", self.pki.ca.crt + self.pki.accepted_cas + self.lab_ca.crt)
        svc_ip = str(next(ipaddress.ip_network(self.service_cidr).hosts()))
        serving = pki.issue_cert(
            self.pki.ca, common_name="kube-apiserver", ip_addresses=[a, svc_ip],
            dns_names=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
            server=True, key_type="ecdsa",
        )
        crt, key = self._pair("apiserver", serving)
        self._serving_der = pki.load_certificate(serving.crt).public_bytes(serialization.Encoding.DER)
        agg_ca = self._write("front-proxy-ca.crt", self.pki.aggregator_ca.crt)
        proxy_crt, proxy_key = self._pair(
            "front-proxy-client",
            pki.issue_cert(self.pki.aggregator_ca, common_name="front-proxy-client", client=True, key_type="ecdsa"),
        )
        sa_key = pki.load_private_key(self.pki.service_account_key)
        sa_priv = self._write("sa.key", pki.to_standard_pem(self.pki.service_account_key))
        sa_pub = self._write(
            "sa.pub",
            sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        )
        self._spawn("kube-apiserver", [
            "kube-apiserver", f"--advertise-address={a}", f"--bind-address={a}", f"--secure-port={self.apiserver_port}",
            f"--etcd-servers=https://{a}:{self.etcd_ports[0]}", f"--etcd-cafile={etcd_ca}",
            f"--etcd-certfile={etcd_crt}", f"--etcd-keyfile={etcd_key}",
            f"--client-ca-file={client_cas}", f"--tls-cert-file={crt}", f"--tls-private-key-file={key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_pub}", f"--service-account-signing-key-file={sa_priv}",
            f"--service-cluster-ip-range={self.service_cidr}", "--authorization-mode=RBAC",
            "--allow-privileged=true", "--profiling=false", "--enable-priority-and-fairness=false",
            f"--requestheader-client-ca-file={agg_ca}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-username-headers=X-Remote-User",
            f"--proxy-client-cert-file={proxy_crt}", f"--proxy-client-key-file={proxy_key}",
            "--endpoint-reconciler-type=none", "--watch-cache=false", "--v=0", "--permit-port-sharing=true",
            *([f"--egress-selector-config-file={self._write('egress-selector.yaml', self.egress_selector)}"]
              if self.egress_selector else []),
        ])

    def _start_controllers(self) -> None:
        a = self.address
        ca = self._write("ca.crt", self.pki.ca.crt)
        ca_key = self._write("ca.key", pki.to_standard_pem(self.pki.ca.key))
        sa_priv = self._write("sa.key", pki.to_standard_pem(self.pki.service_account_key))
        cm = self._component_kubeconfig("system:kube-controller-manager", None)
        self._spawn("kube-controller-manager", [
            "kube-controller-manager", f"--kubeconfig={cm}", f"--authentication-kubeconfig={cm}",
            f"--authorization-kubeconfig={cm}", f"--bind-address={a}", f"--secure-port={self.controller_ports[0]}",
            f"--root-ca-file={ca}", f"--service-account-private-key-file={sa_priv}",
            f"--cluster-signing-cert-file={ca}", f"--cluster-signing-key-file={ca_key}",
            "--use-service-account-credentials=true", "--allocate-node-cidrs=true",
            f"--cluster-cidr={self.pod_cidr}", f"--service-cluster-ip-range={self.service_cidr}",
            "--leader-elect=false", "--controllers=*,-nodeipam,-ttl,-bootstrapsigner,-tokencleaner",
            # A stopped kubelet's Node turns Unknown (its pods not Ready) NODE_MONITOR_GRACE after its
            # last Lease renewal (default 50 s), noticed within 2 s (default 5 s).
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE}s", "--node-monitor-period=2s",
            "--v=0",
        ])
        sched = self._component_kubeconfig("system:kube-scheduler", None)
        self._spawn("kube-scheduler", [
            "kube-scheduler", f"--kubeconfig={sched}", f"--authentication-kubeconfig={sched}",
            f"--authorization-kubeconfig={sched}", f"--bind-address={a}", f"--secure-port={self.controller_ports[1]}",
            "--leader-elect=false", "--v=0",
        ])

    def _ready(self) -> bool:
        if self._probe_ctx is None:
            probe = pki.issue_cert(self.pki.ca, common_name="readyz-probe", organizations=["system:masters"],
                                   client=True, key_type="ecdsa")
            self._probe_ctx = ssl.create_default_context(cadata=self.pki.ca.crt.decode())
            self._probe_ctx.load_cert_chain(*self._pair("readyz-probe", probe))
        with urllib.request.urlopen(f"{self.server}/readyz", context=self._probe_ctx, timeout=5) as r:
            return r.status == 200 and r.read().strip() == b"ok"

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
        self.processes.clear()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
