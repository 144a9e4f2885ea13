"""One emulated Talos machine: its lifecycle, its gRPC server, its fault knobs and counters.

Lifecycle, as a real node: maintenance → (apply config, reboot) → configured → (reset,
reboot) → maintenance. A reboot drops every connection, stops listening for `reboot_delay`
seconds and comes back with a new identity (a fresh maintenance certificate, or a server
certificate from the applied OS CA). A crash (`crash()`) cuts the power with the disk intact:
the node is "crashed", answers nothing (dial.DeadPort: clients time out, they are not refused)
until `power_on()` boots it with the config it had. A configured boot starts its kubelet service
`kubelet_delay` seconds later; a graceful reboot (not a power-cycle, a crash or a FORCE reboot)
first shuts the kubelet down as Talos does (kubelet.py).

The coroutines run on the owning Lab's event loop; the public methods are synchronous and
thread-safe so tests can call them directly.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any, Callable

from google.protobuf.timestamp_pb2 import Timestamp
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from lab.talos_node import dial, etcd_service, tls
from lab.talos_node.server import DroppingServer as _Server
from lab.talos_node.cluster import ClusterRegistry
from lab.talos_node.faults import Faults
from lab.talos_node.kubelet import KubeletService
from lab.talos_node.machineconfig import AppliedConfig

APID_PORT = 50000
DEFAULT_TALOS_VERSION = "v1.13.0"
_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
_EVENT_SEQ = itertools.count(1)  # orders events across the nodes of one process
log = logging.getLogger(__name__)

# What the node's gRPC server serves: a grpclib handler object for this node (rpc.service_for,
# handed in by the Lab so the node does not import the layer that dispatches into it).
ServiceFactory = Callable[["EmulatedNode"], Any]


def check_loopback(address: str) -> str:
    """The lab never binds anything outside 127.0.0.0/8."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"{address!r} is not an IP address; the Talos emulator binds 127.0.0.0/8 only") from None
    if ip not in _LOOPBACK:
        raise ValueError(f"{address} is outside 127.0.0.0/8; the Talos emulator binds loopback addresses only")
    return str(ip)


class EmulatedNode:
    def __init__(
        self,
        address: str,
        *,
        registry: ClusterRegistry[EmulatedNode],
        loop: asyncio.AbstractEventLoop,
        service: ServiceFactory,
        reboot_delay: float = 1.0,
        talos_version: str = DEFAULT_TALOS_VERSION,
        port: int = APID_PORT,
    ) -> None:
        self.address = check_loopback(address)
        self.port = port
        self.registry = registry
        self.talos_version = talos_version
        self.mode = "off"  # off | maintenance | booting | configured | rebooting | crashed
        self.kubelet = KubeletService(self)
        self._config: AppliedConfig | None = None
        # Handed in by the lab from the apiserver, never read from it here: whether the Node of
        # this machine is Ready (None: no Node status known since this boot).
        self.node_ready: bool | None = None
        self.staged: AppliedConfig | None = None
        self.staged_version: str | None = None
        self.etcd_snapshot: bytes | None = None  # /var/lib/etcd.snapshot, uploaded by EtcdRecover
        self.booted_at = Timestamp()
        self.boots = 0  # completed boots; lets a waiter tell a finished reboot from none yet
        self.boot_id = str(uuid.uuid4())
        self.reboot_applied_at: int | None = None  # `boots` when a REBOOT-mode apply was accepted
        self.upgrading = False  # an installer runs (LifecycleService.Upgrade)
        self.events: list[dict] = []  # what happened to the machine, in order (record())
        self.pulled: set[tuple[int, str]] = set()  # (containerd namespace, image) pulled this boot
        self._service = service
        self._loop = loop
        self._faults = Faults(reboot_delay=reboot_delay)
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._server: _Server | None = None
        self._dead_port: dial.DeadPort | None = None  # held while crashed
        self._ssl = None  # this boot's server TLS context
        self._fingerprint: str | None = None
        self._power = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    def __repr__(self) -> str:
        return f"EmulatedNode({self.address}, {self.mode})"

    # --- what the API and the cluster registry read ------------------------------------

    @property
    def config(self) -> AppliedConfig | None:
        return self._config

    @config.setter
    def config(self, new: AppliedConfig | None) -> None:
        old, self._config = self._config, new
        self.kubelet.config_changed(old, new)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def hostname(self) -> str:
        if self.config and self.config.hostname:
            return self.config.hostname
        return "talos-" + self.address.replace(".", "-")

    @property
    def cluster_key(self) -> str | None:
        return self.config.cluster_key if self.config else None

    @property
    def is_control_plane(self) -> bool:
        return bool(self.config and self.config.is_control_plane)

    @property
    def is_up(self) -> bool:
        return self.mode in ("maintenance", "configured") and self._server is not None

    @property
    def fingerprint(self) -> str | None:
        """SPKI SHA-256 of the current maintenance certificate (None when configured)."""
        return self._fingerprint if self.mode == "maintenance" else None

    @property
    def faults(self) -> Faults:
        return self._faults

    # --- thread-safe controls for tests -------------------------------------------------

    def _run(self, coro, timeout: float = 30.0):
        if self._loop.is_closed():
            raise RuntimeError(f"the lab that owns {self.address} has stopped")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def set_faults(self, **changes) -> Faults:
        """Change knobs (see Faults); `refuse` takes effect before this returns."""
        with self._lock:
            self._faults = replace(self._faults, **changes)
        if "refuse" in changes:
            self._run(self._sync_listening())
        return self._faults

    def fail_next(self, count: int, status: Status = Status.UNAVAILABLE, message: str = "injected failure") -> None:
        self.set_faults(fail_next=count, fail_status=status, fail_message=message)

    def clear_faults(self) -> None:
        self.set_faults(latency=0.0, hang=False, refuse=False, fail_next=0, upgrade_fault="", pull_fault="")

    @property
    def calls(self) -> dict[str, int]:
        """Calls received per RPC method name (e.g. "ApplyConfiguration", "Get")."""
        with self._lock:
            return dict(self._calls)

    def reset_calls(self) -> None:
        with self._lock:
            self._calls.clear()

    def record(self, kind: str, **detail: str) -> None:
        """Append to the event log: {seq, time, node, event, ...detail}; seq orders events
        across all nodes of this process."""
        with self._lock:
            self.events.append({"seq": next(_EVENT_SEQ), "time": time.time(), "node": self.address,
                                "event": kind, **detail})

    def event_log(self) -> list[dict]:
        with self._lock:
            return [dict(e) for e in self.events]

    def reboot(self, timeout: float = 30.0) -> None:
        """Power-cycle the node and wait until it is back (a new maintenance identity, too); no
        graceful shutdown: its kubelet just stops."""
        self._run(self._reboot(None, graceful=False), timeout)

    def power_on(self, timeout: float = 30.0) -> None:
        """Boot a node that a reset with reboot=False powered off, or that crashed (with the
        config it had); returns once it listens. A node that is on is left alone."""
        self._run(self._power_on(), timeout)

    def crash(self, timeout: float = 30.0) -> None:
        """Cut the power, disk intact: open connections drop, new ones hang (never refused); its
        etcd member stays listed but unreachable, its kubelet stops (lab/cluster_nodes.py).
        A node that is off or crashed already is left alone."""
        self._run(self._crash(), timeout)

    def wait_for(self, mode: str, timeout: float = 10.0, *, after_boot: int | None = None) -> None:
        """Wait until the node is in `mode` (and, with `after_boot`, has booted since that
        boot count: pass `node.boots` taken before the call that reboots it)."""
        deadline = time.monotonic() + timeout
        while (
            self.mode != mode
            or (mode in ("maintenance", "configured") and not self.is_up)
            or (after_boot is not None and self.boots <= after_boot)
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"emulated node {self.address} is {self.mode}, not {mode}, after {timeout:g} s")
            time.sleep(0.02)

    # --- used by the RPC layer (loop thread) --------------------------------------------

    def count(self, method: str) -> None:
        with self._lock:
            self._calls[method] += 1

    async def inject_faults(self) -> None:
        if self._faults.latency:
            await asyncio.sleep(self._faults.latency)
        while self._faults.hang:
            await asyncio.sleep(0.05)
        with self._lock:
            faults = self._faults
            if faults.fail_next <= 0:
                return
            self._faults = replace(faults, fail_next=faults.fail_next - 1)
        raise GRPCError(faults.fail_status, faults.fail_message)

    def adopt(self, config: AppliedConfig) -> None:
        """Take `config` (while down for a reboot); leaving a cluster leaves its etcd."""
        old_key = self.cluster_key
        self.config = config
        if old_key and old_key != config.cluster_key:
            self.registry.leave(old_key, self.address)
            self.registry.forget_if_empty(old_key)

    def schedule_reboot(self, transition: Callable[[], None] | None, *, power_off: bool = False,
                        graceful: bool = True, drain: bool = False) -> None:
        """Reboot after the current reply has gone out; `transition` runs while the node is
        down (new config, forgotten config, new version). Graceful: its kubelet shuts down first,
        after a cordon and drain with `drain` (a graceful reset, the Upgrade sequence)."""
        task = self._loop.create_task(self._reboot(transition, power_off=power_off, graceful=graceful, drain=drain))
        self._tasks.add(task)
        task.add_done_callback(self._reboot_done)

    def schedule_tls_reload(self) -> None:
        """After the current reply: serve with certificates from the now applied machine.ca and
        accept client certificates of machine.ca + machine.acceptedCAs (apid's live reload; new
        connections see it, open ones are dropped)."""
        task = self._loop.create_task(self._reload_tls())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reload_tls(self) -> None:
        await asyncio.sleep(0)  # let the reply that changed the config leave first
        async with self._power:
            config = self.config
            if self.mode != "configured" or config is None:
                return
            if config.is_control_plane:
                self.registry.remember_issuer(config.cluster_key, config.os_ca)
            issuer = self.registry.issuer(config.cluster_key)
            if issuer is None:
                return
            self._ssl = tls.configured_context(self.address, self.hostname, config, issuer)
            await self._halt()
            await self._sync_listening()

    def _reboot_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.mode = "off"  # a machine whose boot failed is not on the network
            log.error("emulated node %s failed to boot", self.address, exc_info=task.exception())

    # --- lifecycle (loop thread) --------------------------------------------------------

    async def start(self) -> None:
        async with self._power:
            await self._boot()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        async with self._power:
            await self._halt()
            self.kubelet.power_lost()
            if self._dead_port is not None:
                self._dead_port.close()
                self._dead_port = None
            self.mode = "off"
        self.registry.remove_node(self)

    async def _power_on(self) -> None:
        async with self._power:
            if self.mode in ("off", "crashed"):
                await self._boot()

    async def _crash(self) -> None:
        async with self._power:  # a reboot under way finishes first
            if self.mode in ("off", "crashed"):
                return
            await self._halt()
            self.kubelet.power_lost()
            self._dead_port = dial.DeadPort(self.address, self.port)
            self.mode = "crashed"
            self.record("crashed")

    async def _reboot(self, transition: Callable[[], None] | None, *, power_off: bool = False,
                      graceful: bool = True, drain: bool = False) -> None:
        await asyncio.sleep(0)  # let the reply that asked for the reboot leave first
        async with self._power:
            if self.mode == "crashed":  # the power went before the reboot began
                return
            self.mode = "rebooting"
            self.record("reboot")
            if graceful:  # its API answers while the kubelet shuts down (MachineStatus: rebooting)
                await self.kubelet.shut_down(drain=drain)
            await self._halt()
            self.kubelet.power_lost()
            if transition is not None:
                transition()
            if self.staged is not None:
                self.adopt(self.staged)
                self.staged = None
            if self.staged_version is not None:
                new, self.staged_version = self.staged_version, None
                if self._faults.upgrade_fault == "rollback":  # the new version fails to boot: A/B fallback
                    self.record("rolled-back", running=self.talos_version, failed=new)
                else:
                    self.record("upgraded", previous=self.talos_version, version=new)
                    self.talos_version = new
            if power_off:
                self.mode = "off"
                return
            await asyncio.sleep(self._faults.reboot_delay)
            await self._boot()

    async def _boot(self) -> None:
        if self._dead_port is not None:
            self._dead_port.close()
            self._dead_port = None
        self.booted_at.GetCurrentTime()
        self.boot_id = str(uuid.uuid4())
        self.pulled.clear()
        config = self.config
        if config is None:
            self._ssl, self._fingerprint = tls.maintenance_context(self.address)
            self.mode = "maintenance"
        else:
            self.mode = "booting"
            if config.is_control_plane:
                self.registry.remember_issuer(config.cluster_key, config.os_ca)
            # A worker's config has no OS CA key: like trustd, wait for a control plane's.
            while (issuer := self.registry.issuer(config.cluster_key)) is None:
                await asyncio.sleep(0.1)
            self._ssl, self._fingerprint = tls.configured_context(self.address, self.hostname, config, issuer), None
            self.mode = "configured"
            if config.is_control_plane:
                self.registry.join(config.cluster_key, self)
                if self.registry.etcd_standing(config.cluster_key, self.address) == etcd_service.REMOVED:
                    self.record("etcd-failing", error=etcd_service.REMOVED_ERROR)
        await self._sync_listening()
        self.node_ready = None  # machined starts without the Node's status
        if self.mode == "configured":
            self.kubelet.boot()
        self.boots += 1
        self.record("booted", mode=self.mode, version=self.talos_version)

    async def _sync_listening(self) -> None:
        """Listen when the node is up and not refusing; otherwise stop and drop connections."""
        want = self.mode in ("maintenance", "configured") and not self._faults.refuse
        if want and self._server is None:
            server = _Server([self._service(self)])
            await server.start(self.address, self.port, ssl=self._ssl, reuse_address=True)
            self._server = server
        elif not want:
            await self._halt()

    async def _halt(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        server.drop_connections()
        try:
            await asyncio.wait_for(server.wait_closed(), 5.0)
        except asyncio.TimeoutError:
            pass  # a handler ignoring cancellation must not wedge the reboot
