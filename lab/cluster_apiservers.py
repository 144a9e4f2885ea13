"""An emulated cluster's kube-apiservers follow its control-plane machines, as on Talos.

Talos runs kube-apiserver as a static pod on every control plane: down while its machine is
(rebooting, crashed, powered off), a new process once the machine is configured again, started on
a control plane once it is an etcd member (it joined) and gone from one that left (reset,
removed). The lab runs one real kube-apiserver per control plane the same way, each on its
machine's address at the endpoint port, all against the cluster's one lab etcd (the emulator
keeps etcd's membership apart: lab/talos_node/cluster.py). Only HA zones pay for more than one.

The cluster endpoint: when its host is a loopback address that no machine has, the lab serves it
as the operator's load balancer would (lab/endpoint_proxy.py), sending each connection to an
apiserver that is up. When it is a control plane's address, that control plane's apiserver is
the endpoint, down while its machine is down: that is the truth of such a config.

The lab's own clients (kwok as the kubelets, the stand-ins, the controller-manager and scheduler,
the health probe) reach the cluster through a proxy of the same kind on the hosting node's
address, as Talos's kubelets and control-plane components reach it through KubePrism.

Everything here runs on the ClusterRunner's thread, on its tick: a machine that goes down is seen
within a tick, and one that went down and came back between two ticks has a new boot id, so its
apiserver is restarted all the same.
"""

from __future__ import annotations

import ipaddress
import logging
import time

from lab.cluster_config import ClusterConfig
from lab.controlplane import ControlPlane
from lab.endpoint_proxy import TcpProxy
from lab.talos_node import etcd_service
from lab.talos_node.cluster import ClusterRegistry
from lab.talos_node.node import EmulatedNode

log = logging.getLogger(__name__)

POWERED_OFF = ("off", "crashed")  # EmulatedNode modes of a machine without power: no graceful stop
RESTART_BACKOFF = 10.0  # seconds before an apiserver that exited on its own is started again


class ClusterApiservers:
    """One cluster's apiservers, its endpoint's load balancer and the lab clients' proxy."""

    def __init__(self, registry: ClusterRegistry, key: str, name: str, host: EmulatedNode,
                 config: ClusterConfig) -> None:
        self.registry = registry
        self.key = key
        self.name = name
        self.host = host
        self.endpoint_host, self.endpoint_port = config.endpoint_host, config.endpoint_port
        self.clients = TcpProxy(f"{name}-lab-clients", host.address, 0)
        self.endpoint: TcpProxy | None = None  # the load balancer, when the endpoint is no member's
        self.control_plane: ControlPlane | None = None
        self._retry_at: dict[str, float] = {}
        self._endpoint_error: str | None = None
        if not _loopback_v4(self.endpoint_host):
            log.warning("cluster %s: endpoint %s is not a loopback IP; the lab serves no load balancer there, and "
                        "kubeconfigs naming it will not reach the apiservers", name, config.endpoint)

    def start(self) -> str:
        """Start the lab clients' proxy; its URL, for the control plane's clients_via."""
        return self.clients.start().url

    def attach(self, control_plane: ControlPlane, boot_id: str) -> None:
        """The control plane whose first apiserver runs on the host, booted as `boot_id`."""
        self.control_plane = control_plane
        self.clients.backends = control_plane.serving
        first = control_plane.apiservers.get(self.host.address)
        if first is not None:
            first.tag = boot_id

    def stop(self) -> None:
        for proxy in (self.endpoint, self.clients):
            if proxy is not None:
                proxy.stop()
        self.endpoint = None

    def reconcile(self) -> None:
        """One pass: stop the apiservers of machines that are down or left, start those of
        machines that are back or joined, probe those still starting, serve the endpoint."""
        cp = self.control_plane
        if cp is None:
            return
        wanted = self._wanted()
        for address, server in list(cp.apiservers.items()):
            node = wanted.get(address)
            if node is None or node.boot_id != server.tag:
                self._stop(address, node is not None)
            elif not server.process.running():
                log.warning("cluster %s: the kube-apiserver at %s exited; starting it again in %.0f s. Last lines:\n%s",
                            self.name, address, RESTART_BACKOFF, server.process.tail())
                cp.apiservers.pop(address)
                self._retry_at[address] = time.monotonic() + RESTART_BACKOFF
        for address, node in wanted.items():
            # The kubelet runs the static pod: after a boot, the apiserver starts once it does. A
            # kubelet restart leaves a running one alone (its container keeps running).
            if address not in cp.apiservers and node.kubelet.running and \
                    time.monotonic() >= self._retry_at.get(address, 0.0):
                log.info("cluster %s: %s (%s) runs; starting its kube-apiserver", self.name, node.hostname, address)
                cp.start_apiserver(address, hostname=node.hostname, tag=node.boot_id)
        for address in list(cp.apiservers):
            cp.apiserver_ready(address)  # probes only those not ready yet
        self._serve_endpoint()

    def _wanted(self) -> dict[str, EmulatedNode]:
        """Control planes whose apiserver runs: configured (up) and members of the cluster's etcd
        (Talos's apiserver talks to its own node's etcd member)."""
        return {n.address: n for n in self.registry.nodes_of(self.key)
                if n.mode == "configured" and n.config is not None and n.is_control_plane
                and self.registry.etcd_standing(self.key, n.address) == etcd_service.MEMBER}

    def _stop(self, address: str, rebooted: bool) -> None:
        node = self.registry.node(address)
        mode = "rebooted" if rebooted else (node.mode if node is not None else "gone")
        kill = node is None or node.mode in POWERED_OFF  # the power went: no graceful stop
        log.info("cluster %s: %s is %s; its kube-apiserver %s", self.name, address, mode,
                 "is killed" if kill else "stops")
        assert self.control_plane is not None
        self.control_plane.stop_apiserver(address, kill=kill)
        self._retry_at.pop(address, None)

    def _serve_endpoint(self) -> None:
        """A load balancer on the endpoint when it is a loopback address no machine has: on a
        machine's address (a control plane's, or one that was) only that machine could answer."""
        wanted = _loopback_v4(self.endpoint_host) and self.registry.node(self.endpoint_host) is None
        if wanted and self.endpoint is None:
            assert self.control_plane is not None
            proxy = TcpProxy(f"{self.name}-endpoint", self.endpoint_host, self.endpoint_port,
                             self.control_plane.serving)
            try:
                self.endpoint = proxy.start()
            except RuntimeError as e:
                if str(e) != self._endpoint_error:
                    log.warning("cluster %s: cannot serve the endpoint's load balancer, retrying: %s", self.name, e)
                self._endpoint_error = str(e)
                return
            self._endpoint_error = None
            log.info("cluster %s: the endpoint %s:%d is served as a load balancer over the control planes' "
                     "apiservers", self.name, self.endpoint_host, self.endpoint_port)
        elif not wanted and self.endpoint is not None:
            self.endpoint.stop()
            self.endpoint = None


def _loopback_v4(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.version == 4 and ip.is_loopback
