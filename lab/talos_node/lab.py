"""A set of emulated Talos nodes served from one background event loop.

    with Lab(reboot_delay=0.2) as lab:
        node = lab.add_node()            # next free address of the pool, or add_node("127.0.0.11")
        ...                              # talk to node.address:50000 from any thread
    # every server is stopped here

Nodes of one Lab share a ClusterRegistry (bootstrap state, etcd members, health probes).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
import ssl
import threading
from typing import Iterable

from lab.talos_node.cluster import ClusterRegistry, HealthProbe
from lab.talos_node.node import APID_PORT, DEFAULT_TALOS_VERSION, EmulatedNode, check_loopback

DEFAULT_POOL = "127.0.21.0/24"  # the emulator's own range for tests and ad-hoc use
log = logging.getLogger(__name__)


def _quiet_tls_noise(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """Clients we reject at the TLS layer (no certificate, wrong CA) or that vanish mid-call
    are part of the emulation, not errors of the lab."""
    exc = context.get("exception")
    if isinstance(exc, (ssl.SSLError, ConnectionError, asyncio.CancelledError)):
        log.debug("talos emulator: %s: %s", context.get("message"), exc)
        return
    loop.default_exception_handler(context)


def _bindable(address: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                return False
            raise
    return True


class Lab:
    def __init__(
        self,
        *,
        reboot_delay: float = 1.0,
        talos_version: str = DEFAULT_TALOS_VERSION,
        pool: str = DEFAULT_POOL,
        registry: ClusterRegistry | None = None,
        port: int = APID_PORT,
    ) -> None:
        network = ipaddress.ip_network(pool)
        check_loopback(str(network.network_address))
        check_loopback(str(network.broadcast_address))
        self.reboot_delay = reboot_delay
        self.talos_version = talos_version
        self.port = port
        self.clusters = registry or ClusterRegistry()
        self._pool = network
        self._nodes: list[EmulatedNode] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> Lab:
        if self._loop is not None:
            return self
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(_quiet_tls_noise)
        thread = threading.Thread(target=loop.run_forever, name="talos-emulator", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node and the loop; safe to call twice."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self._call(self._stop_nodes(), timeout)
            self._call(loop.shutdown_default_executor(), timeout)  # health probes run there
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            loop.close()
            self._loop = self._thread = None
            self._nodes.clear()

    def __enter__(self) -> Lab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _stop_nodes(self) -> None:
        await asyncio.gather(*(node.stop() for node in self._nodes), return_exceptions=True)
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _call(self, coro, timeout: float = 30.0):
        if self._loop is None:
            raise RuntimeError("the lab is not started; use `with Lab() as lab:` or lab.start()")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- nodes --------------------------------------------------------------------------

    @property
    def nodes(self) -> list[EmulatedNode]:
        return list(self._nodes)

    def node(self, address: str) -> EmulatedNode:
        for node in self._nodes:
            if node.address == address:
                return node
        raise KeyError(f"no emulated node at {address}")

    def free_address(self) -> str:
        """The next pool address no node of this lab uses and nothing else listens on."""
        taken = {n.address for n in self._nodes}
        for host in self._pool.hosts():
            address = str(host)
            if address not in taken and _bindable(address, self.port):
                return address
        raise RuntimeError(f"no free address left in {self._pool} for another emulated Talos node")

    def add_node(self, address: str | None = None, *, reboot_delay: float | None = None) -> EmulatedNode:
        """Start a node in maintenance mode and return once it listens on address:50000."""
        address = check_loopback(address) if address else self.free_address()

        async def create() -> EmulatedNode:
            node = EmulatedNode(
                address,
                registry=self.clusters,
                loop=asyncio.get_running_loop(),
                reboot_delay=self.reboot_delay if reboot_delay is None else reboot_delay,
                talos_version=self.talos_version,
                port=self.port,
            )
            self.clusters.add_node(node)
            try:
                await node.start()
            except BaseException:
                self.clusters.remove_node(node)
                raise
            return node

        node = self._call(create())
        self._nodes.append(node)
        return node

    def add_nodes(self, count: int, **options) -> list[EmulatedNode]:
        return [self.add_node(**options) for _ in range(count)]

    def set_health_probe(self, cluster_key: str, probe: HealthProbe | None) -> None:
        """See ClusterRegistry.set_health_probe."""
        self.clusters.set_health_probe(cluster_key, probe)

    def cluster_nodes(self, cluster_key: str) -> Iterable[EmulatedNode]:
        return self.clusters.nodes_of(cluster_key)
