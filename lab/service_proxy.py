"""Service routing for a lab cluster's kube-apiserver (lab stand-in for Cilium's service
load-balancing on the control-plane host).

A kube-apiserver calls admission webhooks (and aggregated APIs) at their Service's ClusterIP,
which Cilium's socket load-balancer turns into a connection to a ready endpoint. Nothing routes
ClusterIPs here, and EndpointSlices cannot hold the loopback addresses lab pods run on, so the
lab gives the apiserver an egress selector for its "cluster" network (its HTTP CONNECT proxy
protocol, as konnectivity uses) pointing at this proxy, which does what Cilium would:
- CONNECT <ClusterIP>:<port> → the Service owning that ClusterIP and port → its target port on a
  Running and Ready pod the Service selects. Only a host-network pod's address (its node's, a
  loopback address the lab owns) can be dialled; a Service with none refuses the connection
  (502), as a Service without reachable endpoints would;
- CONNECT to a loopback address (the apiserver itself, kubernetes.default) → dialled as is;
- anything else → 502.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import socket
import socketserver
import tempfile
import threading
from pathlib import Path

from kubernetes import client

from lab.standins.loop import REQUEST_TIMEOUT, api_client

log = logging.getLogger(__name__)

DIAL_TIMEOUT = 5.0
HEADER_LIMIT = 16384


def socket_path(workdir: Path) -> Path:
    """The proxy's Unix socket: in the cluster's directory, or in /tmp when that path is too long
    for a socket address (108 bytes). (The apiserver's plain-TCP HTTP CONNECT egress crashes in
    1.35 without TLS settings, so the socket transport it also offers is used.)"""
    path = Path(workdir) / "egress.sock"
    if len(str(path)) < 100:
        return path
    return Path(tempfile.gettempdir()) / f"kontinuum-egress-{hashlib.sha256(str(workdir).encode()).hexdigest()[:12]}.sock"


def egress_config(sock: Path) -> str:
    return ("apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n"
            "- name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n"
            f"    transport:\n      uds:\n        udsName: {sock}\n")


def _target_port(svc: client.V1Service, port: int):
    for p in svc.spec.ports or []:
        if p.port == port:
            return p.target_port if p.target_port is not None else p.port
    return None


def _container_port(pod: client.V1Pod, target) -> int | None:
    if isinstance(target, int) or (isinstance(target, str) and target.isdigit()):
        return int(target)
    for c in pod.spec.containers:
        for p in c.ports or []:
            if p.name == target:
                return p.container_port
    return None


def resolve(core: client.CoreV1Api, host: str, port: int) -> tuple[str, int] | None:
    """Where a CONNECT to host:port goes, or None."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.is_loopback:
        return host, port
    for svc in core.list_service_for_all_namespaces(_request_timeout=REQUEST_TIMEOUT).items:
        if svc.spec.cluster_ip != host or not svc.spec.selector:
            continue
        target = _target_port(svc, port)
        if target is None:
            return None
        selector = ",".join(f"{k}={v}" for k, v in svc.spec.selector.items())
        pods = core.list_namespaced_pod(svc.metadata.namespace, label_selector=selector,
                                        _request_timeout=REQUEST_TIMEOUT).items
        for pod in sorted(pods, key=lambda p: p.metadata.name):
            ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
            if pod.status.phase != "Running" or not ready or not pod.spec.host_network or not pod.status.host_ip:
                continue
            cport = _container_port(pod, target)
            if cport is not None:
                return pod.status.host_ip, cport
        return None
    return None


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        proxy: ServiceProxy = self.server.proxy  # type: ignore[attr-defined]
        head = b""
        while b"\r\n\r\n" not in head and len(head) < HEADER_LIMIT:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode(errors="replace").split()
        if len(line) < 2 or line[0] != "CONNECT":
            self.request.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            return
        host, _, port = line[1].rpartition(":")
        try:
            where = resolve(proxy.core, host.strip("[]"), int(port))
        except Exception as e:  # noqa: BLE001 - reported to the caller as a bad gateway
            log.warning("service proxy %s: cannot resolve %s: %s", proxy.cluster, line[1], e)
            where = None
        if where is None:
            self.request.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            return
        try:
            upstream = socket.create_connection(where, timeout=DIAL_TIMEOUT)
        except OSError:
            self.request.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            return
        upstream.settimeout(None)
        self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            upstream.sendall(rest)
        _pipe(self.request, upstream)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    def copy(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    t = threading.Thread(target=copy, args=(b, a), daemon=True)
    t.start()
    copy(a, b)
    t.join(30)
    b.close()


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


class ServiceProxy:
    """The CONNECT proxy of one cluster, on a Unix socket only its apiserver uses."""

    def __init__(self, sock: Path, kubeconfig: Path, *, cluster: str):
        self.sock, self.cluster = Path(sock), cluster
        self.kubeconfig = kubeconfig
        self._api: client.ApiClient | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def core(self) -> client.CoreV1Api:
        if self._api is None:
            self._api = api_client(self.kubeconfig)
        return client.CoreV1Api(self._api)

    def start(self) -> "ServiceProxy":
        self.sock.unlink(missing_ok=True)
        self._server = _Server(str(self.sock), _Handler)
        self._server.proxy = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"service-proxy-{self.cluster}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            self.sock.unlink(missing_ok=True)
        if self._api is not None:
            self._api.close()
            self._api = None
