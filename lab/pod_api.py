"""KubePrism on every lab machine, and the API address a process the lab runs for a pod dials.

KubePrism: Talos runs on every machine with `machine.features.kubePrism` enabled a TCP load
balancer on localhost:<port> (7445) over the cluster's apiservers. The lab runs one per machine
on the machine's own loopback address at that port: KubePrism of machine 127.0.43.21 is
127.0.43.21:7445, since a host-network pod on that machine shares its loopback, which the lab
models as the machine's address.

A process the lab runs for a pod (the Flux Operator, Flux's controllers) gets its API address
from the pod's own environment, as an in-cluster client does: KUBERNETES_SERVICE_HOST/PORT as
the container's env sets them, else the kubernetes Service's ClusterIP and port (what the kubelet
injects). resolve() maps that address to what the pod's machine would reach:
- localhost / 127.0.0.1 (host network) → the machine's address at the same port: its KubePrism
  at 7445, a control plane's own apiserver at the endpoint port, nothing (refused) elsewhere;
- the Service ClusterIP → the Service dataplane: once Cilium's agent is Ready on the pod's node
  (or kube-proxy is enabled), the machine's KubePrism stands for it (both end at an apiserver);
  before that a black hole;
- any other loopback address as it is; anything else a black hole (the lab never dials off
  this machine).
A black hole is a listener whose accept queue is kept full: the kernel drops every SYN, so a
connect never completes and the client's own dial timeout ends it ("dial tcp ...: i/o timeout"),
as a ClusterIP without a dataplane does on a node.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass

from lab.cluster_config import v1alpha1
from lab.endpoint_proxy import Backends, TcpProxy
from lab.kwok import CNI_READY_ANNOTATION

log = logging.getLogger(__name__)

LOCALHOST = ("localhost", "127.0.0.1", "::1")


def kubeprism_port(raw_config: bytes) -> int | None:
    """The KubePrism port of a machine config, None when KubePrism is off."""
    prism = ((v1alpha1(raw_config).get("machine") or {}).get("features") or {}).get("kubePrism") or {}
    return int(prism.get("port") or 7445) if prism.get("enabled") else None


class KubePrisms:
    """One KubePrism listener per configured machine of a cluster that enables it."""

    def __init__(self, cluster: str, backends: Backends) -> None:
        self.cluster, self.backends = cluster, backends
        self.proxies: dict[str, TcpProxy] = {}  # machine address -> its listener

    def reconcile(self, machines) -> None:
        """`machines`: EmulatedNodes of the cluster; those configured and up get a listener."""
        wanted = {}
        for m in machines:
            if m.mode == "configured" and m.config is not None:
                port = kubeprism_port(m.config.raw)
                if port:
                    wanted[m.address] = port
        for address in [a for a in self.proxies if wanted.get(a) != self.proxies[a].port]:
            self.proxies.pop(address).stop()
        for address, port in wanted.items():
            if address not in self.proxies:
                try:
                    self.proxies[address] = TcpProxy(f"{self.cluster}-kubeprism@{address}", address, port,
                                                     self.backends).start()
                    log.info("cluster %s: KubePrism on %s:%d", self.cluster, address, port)
                except RuntimeError as e:
                    log.warning("cluster %s: KubePrism: %s", self.cluster, e)

    def stop(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()
        self.proxies.clear()


class BlackHole:
    """A loopback address:port whose connections never complete (see the module docstring)."""

    def __init__(self, address: str) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind((address, 0))
        self.listener.listen(0)
        self.address, self.port = self.listener.getsockname()[:2]
        # One connection fills the zero-length accept queue; it is never accepted.
        self.filler = socket.create_connection((self.address, self.port), timeout=2.0)

    def close(self) -> None:
        self.filler.close()
        self.listener.close()


@dataclass(frozen=True)
class Route:
    """Where the process dials (host, port), the name TLS verifies, and what the pod asked for."""

    host: str
    port: int
    server_name: str
    asked: str  # "<host>:<port>" as the pod's env (or the kubelet's injection) says
    why: str  # how the lab mapped it, for the log

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"


def asked_address(pod: dict, service: tuple[str, int]) -> tuple[str, int]:
    """KUBERNETES_SERVICE_HOST/PORT of the pod's first container, else the Service's (injected)."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    env = {e.get("name"): e.get("value") for e in containers[0].get("env") or []}
    host = env.get("KUBERNETES_SERVICE_HOST") or service[0]
    try:
        port = int(env.get("KUBERNETES_SERVICE_PORT") or service[1])
    except ValueError:
        port = service[1]
    return host, port


def resolve(pod: dict, *, machine: str, service: tuple[str, int], dataplane: bool, black_hole: BlackHole) -> Route:
    """The Route for a process of `pod` (the API's JSON) on the machine at `machine`; `dataplane`:
    the Service ClusterIP is served on that machine (Cilium Ready there, or kube-proxy)."""
    host, port = asked_address(pod, service)
    asked = f"{host}:{port}"
    hole = Route(black_hole.address, black_hole.port, host, asked, "")
    if host in LOCALHOST:
        return Route(machine, port, host, asked, f"the machine's own {machine}:{port}")
    if host == service[0] and port == service[1]:
        if dataplane:
            return Route(machine, 7445, host, asked, "the Service dataplane, through the machine's KubePrism")
        return Route(hole.host, hole.port, host, asked, "a black hole: no Service dataplane on the node yet")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return Route(host, port, host, asked, "as it is (loopback)")
    return Route(hole.host, hole.port, host, asked, "a black hole: not an address on this machine")


def dataplane_on(node: dict | None, kube_proxy: bool) -> bool:
    """Whether the Service ClusterIP is served on the Node (the API's JSON)."""
    return kube_proxy or ((node or {}).get("metadata", {}).get("annotations") or {}).get(CNI_READY_ANNOTATION) == "true"


def machine_address(node: dict | None) -> str | None:
    for a in ((node or {}).get("status") or {}).get("addresses") or []:
        if a.get("type") == "InternalIP":
            return a.get("address")
    return None
