"""What one kube-apiserver of a lab control plane is made of: its serving certificate, its flags,
and the readiness probe that tells it apart from another apiserver sharing its port.

Talos runs an apiserver static pod on every control plane, each against its own node's etcd, all
behind the cluster endpoint. Its serving certificate names what Talos's
KubernetesCertSANsController (v1.13) puts in it: the endpoint host, cluster.apiServer.certSANs,
the kubernetes Service names and IP, localhost and 127.0.0.1, the node's hostname and addresses.
So a client that dials the endpoint (a load balancer in front of every control plane, or one
control plane's own address) verifies whichever apiserver answers, and a client that dials
localhost (KubePrism, the lab's own clients) does too.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization

from kontinuum.talos import pki
from kontinuum.talos.pki import CertKey
from lab.process import Managed

PROBE_TIMEOUT = 3.0  # seconds for one /readyz probe (connect, TLS, reply)
_REPAIRS = ("repair.go:", "repairip.go:")  # the Service port and ClusterIP repair controllers' sources


@dataclass(frozen=True)
class ServingNames:
    """The names a cluster's apiserver certificates carry besides their node's own: the endpoint
    host and cluster.apiServer.certSANs (IPs and DNS names mixed, as in the config)."""

    sans: tuple[str, ...] = ()
    dns_domain: str = "cluster.local"

    def split(self, address: str, hostname: str | None, service_ip: str) -> tuple[list[str], list[str]]:
        """(IPs, DNS names) for the apiserver of the node at `address`, in Talos's order, deduplicated."""
        ips, dns = [], []
        names = [*self.sans, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 f"kubernetes.default.svc.{self.dns_domain}", "localhost", *([hostname] if hostname else []),
                 service_ip, address, "127.0.0.1"]
        for name in names:
            try:
                ip = str(ipaddress.ip_address(name))
            except ValueError:
                if name and name not in dns:
                    dns.append(name)
                continue
            if ip not in ips:
                ips.append(ip)
        return ips, dns


@dataclass
class Apiserver:
    """One running kube-apiserver: where it listens, what it serves, on which cluster CAs."""

    address: str
    process: Managed
    serving_der: bytes  # its serving certificate, to tell it from another on the same port
    cluster_ca: bytes  # the cluster CA (PEM) that issued it
    pki: object  # the CAs and keys it runs on (lab.controlplane.ClusterPKI; compared, never read here)
    hostname: str | None = None
    tag: object = None  # its owner's mark; the lab's: the boot id of the machine it runs on
    ready: bool = False  # /readyz answered ok once; it stays so until the process ends

    @property
    def up(self) -> bool:
        return self.ready and self.process.running()


def serving_cert(ca: CertKey, address: str, hostname: str | None, names: ServingNames, service_cidr: str) -> CertKey:
    service_ip = str(next(ipaddress.ip_network(service_cidr).hosts()))
    ips, dns = names.split(address, hostname, service_ip)
    return pki.issue_cert(ca, common_name="kube-apiserver", ip_addresses=ips, dns_names=dns, server=True,
                          key_type="ecdsa")


def files(write, pair, pki_, lab_ca_crt: bytes) -> dict[str, str]:
    """The files every apiserver of a control plane shares, written with its `write(rel, data)`
    and `pair(rel, CertKey)`; pki_ is its ClusterPKI. Clients of the lab CA are always accepted."""
    etcd_crt, etcd_key = pair("apiserver-etcd-client", pki.issue_cert(
        pki_.etcd_ca, common_name="kube-apiserver", client=True, key_type="ecdsa"))
    proxy_crt, proxy_key = pair("front-proxy-client", pki.issue_cert(
        pki_.aggregator_ca, common_name="front-proxy-client", client=True, key_type="ecdsa"))
    sa_pub = pki.load_private_key(pki_.service_account_key).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return {
        "etcd_ca": write("etcd/ca.crt", pki_.etcd_ca.crt), "etcd_crt": etcd_crt, "etcd_key": etcd_key,
        "client_cas": write("client-ca.crt", pki_.ca.crt + pki_.accepted_cas + lab_ca_crt),
        "agg_ca": write("front-proxy-ca.crt", pki_.aggregator_ca.crt), "proxy_crt": proxy_crt, "proxy_key": proxy_key,
        "sa_key": write("sa.key", pki.to_standard_pem(pki_.service_account_key)), "sa_pub": write("sa.pub", sa_pub),
    }


def argv(address: str, port: int, etcd_url: str, files: dict[str, str], service_cidr: str,
         egress_selector_file: str | None) -> list[str]:
    """kube-apiserver's flags; `files` maps etcd_ca, etcd_crt, etcd_key, client_cas, crt, key,
    sa_pub, sa_key, agg_ca, proxy_crt, proxy_key to paths."""
    f = files
    return [
        "kube-apiserver", f"--advertise-address={address}", f"--bind-address={address}", f"--secure-port={port}",
        f"--etcd-servers={etcd_url}", f"--etcd-cafile={f['etcd_ca']}",
        f"--etcd-certfile={f['etcd_crt']}", f"--etcd-keyfile={f['etcd_key']}",
        f"--client-ca-file={f['client_cas']}", f"--tls-cert-file={f['crt']}", f"--tls-private-key-file={f['key']}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={f['sa_pub']}", f"--service-account-signing-key-file={f['sa_key']}",
        f"--service-cluster-ip-range={service_cidr}", "--authorization-mode=RBAC",
        "--allow-privileged=true", "--profiling=false", "--enable-priority-and-fairness=false",
        f"--requestheader-client-ca-file={f['agg_ca']}", "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-username-headers=X-Remote-User",
        f"--proxy-client-cert-file={f['proxy_crt']}", f"--proxy-client-key-file={f['proxy_key']}",
        # Several apiservers share one etcd here as on Talos; none owns the kubernetes Endpoints.
        "--endpoint-reconciler-type=none", "--watch-cache=false", "--v=0",
        # A restart on new CAs starts the new apiserver beside the old one (controlplane.restart_with).
        "--permit-port-sharing=true",
        *([f"--egress-selector-config-file={egress_selector_file}"] if egress_selector_file else []),
    ]


def readyz(server: Apiserver, port: int, client: tuple[str, str], *, attempts: int = 1,
           timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether `server` itself answers /readyz with ok: its certificate verified against its
    cluster CA for its address, and equal to its own (another apiserver may share the port while
    one restarts, so up to `attempts` connections are tried). A refused connection is False."""
    ctx = ssl.create_default_context(cadata=server.cluster_ca.decode())
    ctx.load_cert_chain(*client)
    for _ in range(attempts):
        try:
            with socket.create_connection((server.address, port), timeout=timeout) as raw, \
                    ctx.wrap_socket(raw, server_hostname=server.address) as tls:
                if tls.getpeercert(binary_form=True) != server.serving_der:
                    continue
                tls.sendall(f"GET /readyz HTTP/1.1\r\nHost: {server.address}\r\nConnection: close\r\n\r\n".encode())
                reply = b""
                while chunk := tls.recv(4096):
                    reply += chunk
                return reply.startswith(b"HTTP/1.1 200")  # 500 while a readiness check fails
        except ssl.SSLCertVerificationError:
            continue  # another apiserver on the port, on other CAs
        except OSError:
            return False
    return False


def repair_failed(server: Apiserver) -> bool:
    """Whether the apiserver's first Service port or ClusterIP repair failed, which dooms a
    starting one: its post-start hook start-service-ip-repair-controllers waits one minute for
    both to succeed once, and the port repair tries again only after 3 min, the ClusterIP repair
    never (Kubernetes v1.35.4 pkg/registry/core/rest/storage_core.go, service/*allocator/controller),
    so it exits then. A restarted apiserver sharing its port with the old one meets that when its
    loopback client reaches the old one (x509: certificate signed by unknown authority); seen in
    the suite under load."""
    marks = tuple(f" {server.process.popen.pid} {source}" for source in _REPAIRS)
    try:
        lines = server.process.log_path.read_text(errors="replace").splitlines()
    except OSError:
        return False
    return any(line.startswith("E") and '"Unhandled Error"' in line and any(m in line for m in marks) for line in lines)
