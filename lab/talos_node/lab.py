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
import fcntl
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
import threading
from pathlib import Path

from lab.talos_node import rpc
from lab.talos_node.cluster import ClusterRegistry, HealthProbe
from lab.talos_node.node import APID_PORT, DEFAULT_TALOS_VERSION, EmulatedNode, check_loopback

DEFAULT_POOL = "127.0.21.0/24"  # the emulator's own range for tests and ad-hoc use
_CLAIMS = Path(tempfile.gettempdir()) / "kontinuum-talos-nodes"
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


def _claim(address: str, port: int) -> int | None:
    """Hold address:port for a node's whole life, reboots included, against every Lab in any
    process: a node that is rebooting does not listen, so a bind test alone would hand its
    address to someone else. An flock dies with its process. Returns the lock's fd."""
    _CLAIMS.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(_CLAIMS / f"{address}-{port}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


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
        self._claims: dict[str, int] = {}
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
            for fd in self._claims.values():
                os.close(fd)
            self._claims.clear()

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

    def _reserve(self, address: str | None) -> tuple[str, int]:
        """Claim `address`, or the first free one of the pool; returns it with its claim."""
        candidates = [check_loopback(address)] if address else [str(h) for h in self._pool.hosts()]
        for candidate in candidates:
            fd = _claim(candidate, self.port)
            if fd is None:
                continue
            if _bindable(candidate, self.port):
                return candidate, fd
            os.close(fd)
        if address:
            raise RuntimeError(f"{address}:{self.port} is in use (by another emulated node or another program)")
        raise RuntimeError(f"no free address left in {self._pool} for another emulated Talos node")

    def free_address(self) -> str:
        """A pool address that nothing uses right now, e.g. for an emulator in another process."""
        address, fd = self._reserve(None)
        os.close(fd)
        return address

    def add_node(self, address: str | None = None, *, reboot_delay: float | None = None) -> EmulatedNode:
        """Start a node in maintenance mode and return once it listens on address:50000."""
        address, claim = self._reserve(address)

        async def create() -> EmulatedNode:
            node = EmulatedNode(
                address,
                registry=self.clusters,
                loop=asyncio.get_running_loop(),
                service=rpc.service_for,
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

        try:
            node = self._call(create())
        except BaseException:
            os.close(claim)
            raise
        self._claims[address] = claim
        self._nodes.append(node)
        return node

    def add_nodes(self, count: int, **options) -> list[EmulatedNode]:
        return [self.add_node(**options) for _ in range(count)]

    def set_health_probe(self, cluster_key: str, probe: HealthProbe | None) -> None:
        """See ClusterRegistry.set_health_probe."""
        self.clusters.set_health_probe(cluster_key, probe)
