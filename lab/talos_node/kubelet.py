"""The kubelet service of one emulated machine, as machined runs it (Talos v1.13.0
internal/app/machined/pkg/system: service_runner.go, runner/containerd, runner/restart).

The machine runs the service; the lab plays the kubelet process against the cluster's apiserver
(lab/cluster_nodes.py). What each side owns:
- here: the service's state and event history (ServiceList, the COSI Service resource, the
  MachineStatus "services" check), started `kubelet_delay` seconds after each boot (the
  KubeletServiceController starts it once its inputs are ready) and restarted, without a reboot,
  when an applied config changes what the kubelet runs with (its KubeletSpec or secrets:
  machine.kubelet, the cluster endpoint, cluster.ca and cluster.acceptedCAs). A restart stops the
  process (SIGTERM) and starts it again: the Lease is not renewed for that moment only, the Node
  stays Ready, as on Talos.
- a graceful reboot first signals the kubelet (Talos's logind mock emits PrepareForShutdown) and
  waits, bounded, for its inhibitor lock (after cordoning and draining the node when the sequence
  does: a graceful reset, the Upgrade sequence; `drain`): the kubelet's shutdown manager reports the Node NotReady
  ("node is shutting down") and terminates its pods, then releases it. The lab's player takes the
  lock (`player`), is woken by the signal and releases it with `release_shutdown()`.
- a crash or power-off just stops it: nothing is reported, the Lease goes unrenewed.
Its history lives in machined's memory, so each boot starts a new one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from lab.talos_node.faults import Faults
from lab.talos_node.machineconfig import v1alpha1_document

if TYPE_CHECKING:
    from lab.talos_node.machineconfig import AppliedConfig

log = logging.getLogger(__name__)
MAX_EVENTS = 64  # events.MaxEventsToKeep
SHUTDOWN_WAIT = 10.0  # seconds a reboot waits for the lab's drain and kubelet to release the lock (a kubelet whose API is gone does not hold it long)
WAITING = 'Waiting for service "cri" to be "up", time sync, network'
_PIDS = itertools.count(2101)


@dataclass(frozen=True)
class ServiceEvent:
    state: str  # Talos ServiceState name: Starting, Waiting, Preparing, Running, Stopping, Finished
    message: str
    at: float  # time.time()


def kubelet_inputs(config: AppliedConfig | None) -> tuple:
    """What the kubelet runs with, from an applied config: a change restarts it (KubeletSpec and
    the kubelet secrets are built from these)."""
    if config is None:
        return ()
    doc = v1alpha1_document(config.raw)
    machine, cluster = doc.get("machine") or {}, doc.get("cluster") or {}
    network = cluster.get("network") or {}
    return (repr(machine.get("kubelet")), repr((cluster.get("controlPlane") or {}).get("endpoint")),
            repr(cluster.get("ca")), repr(cluster.get("acceptedCAs")), repr(cluster.get("token")),
            repr(network.get("dnsDomain")), repr(network.get("serviceSubnets")))


class Machine(Protocol):
    """What the service reads of its machine (node.EmulatedNode fits)."""

    address: str
    mode: str
    boot_id: str

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def faults(self) -> Faults: ...

    def record(self, kind: str, **detail: str) -> None: ...


class KubeletService:
    """The kubelet service of `node`; mutated on the node's loop, read from any thread."""

    def __init__(self, node: Machine) -> None:
        self._node = node
        self.state = "Initialized"
        self.healthy = False
        self.health_message = ""
        self.health_changed = time.time()
        self.events: list[ServiceEvent] = []
        self.boot_id: str | None = None  # the boot it was last started in
        self.shutting_down = False  # PrepareForShutdown sent, the inhibitor lock not released yet
        self.drain = False  # the sequence cordons and drains the node before the kubelet shuts down
        # The lab's kubelet player: called (any thread, must return at once) when the machine
        # signals a shutdown or the kubelet started; it holds the inhibitor lock while set.
        self.player: Callable[[], None] | None = None
        self._pid = 0
        self._task: asyncio.Task | None = None
        self._released: asyncio.Event | None = None

    @property
    def running(self) -> bool:
        """The kubelet process runs in the machine's current boot (a restart's gap included: its
        Node and Lease are left alone for that moment)."""
        node = self._node
        return (node.mode == "configured" and self.boot_id == node.boot_id
                and (self.state == "Running" or self._task is not None))

    @property
    def up(self) -> bool:
        """Running and healthy: what Talos's boot sequence waits for."""
        return self.state == "Running" and self.healthy

    # --- what the machine does (loop thread) -------------------------------------------------

    def boot(self) -> None:
        """A new boot: machined's history starts afresh and the service starts after the delay."""
        self.power_lost()
        self.events = []
        self.state = "Initialized"
        self._start()

    def power_lost(self) -> None:
        """The machine went down without a word (crash, power-off, or the end of a reboot)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._released is not None:
            self._released.set()
        self.shutting_down = False
        self._set_health(False, "service not running")

    def config_changed(self, old: AppliedConfig | None, new: AppliedConfig | None) -> None:
        """An applied config: a machine that left its cluster drops the cluster's player; a live
        change of what the kubelet runs with restarts it."""
        if (old.cluster_key if old else None) != (new.cluster_key if new else None):
            self.player = None
        if old is None or new is None or self._node.mode != "configured" or self.state != "Running":
            return
        if kubelet_inputs(old) != kubelet_inputs(new):
            self._node.record("kubelet-restart")
            self._restart()

    async def shut_down(self, *, drain: bool = False) -> None:
        """A graceful reboot: (drain,) signal the kubelet, wait for its inhibitor lock, stop it."""
        if self.state != "Running" and self._task is None:
            return
        if self._task is not None:  # still starting: the start is abandoned
            self._task.cancel()
            self._task = None
        player = self.player
        if player is not None and self.state == "Running":
            self._released = asyncio.Event()
            self.drain = drain
            self.shutting_down = True
            player()
            try:
                await asyncio.wait_for(self._released.wait(), SHUTDOWN_WAIT)
            except asyncio.TimeoutError:
                log.warning("emulated node %s: the kubelet did not release its shutdown lock within %g s; "
                            "rebooting anyway", self._node.address, SHUTDOWN_WAIT)
            self.shutting_down = False
        self._stop()

    def release_shutdown(self) -> None:
        """The lab's kubelet has reported the shutdown (any thread)."""
        released = self._released
        if released is not None:
            self._node.loop.call_soon_threadsafe(released.set)

    # --- the service runner ------------------------------------------------------------------

    def _record(self, state: str, message: str) -> None:
        self.state = state
        self.events = [*self.events, ServiceEvent(state, message, time.time())][-MAX_EVENTS:]
        if state != "Running":
            self._set_health(False, "service not running")

    def _set_health(self, healthy: bool, message: str) -> None:
        if healthy != self.healthy:
            self.health_changed = time.time()
        self.healthy, self.health_message = healthy, message

    def _stop(self) -> None:
        if self.state == "Running":
            self._record("Stopping", f"Sending SIGTERM to task kubelet (PID {self._pid}, container kubelet)")
            self._record("Finished", "Service finished successfully")

    def _restart(self) -> None:
        self._stop()
        self._start()

    def _start(self) -> None:
        self._task = self._node.loop.create_task(self._run_start())

    async def _run_start(self) -> None:
        self._record("Starting", "Starting service")
        self._record("Waiting", WAITING)
        await asyncio.sleep(self._node.faults.kubelet_delay)
        self._record("Preparing", "Running pre state")
        self._record("Preparing", "Creating service runner")
        self._pid = next(_PIDS)
        self.boot_id = self._node.boot_id
        self._record("Running", f"Started task kubelet (PID {self._pid}) for container kubelet")
        self.events = [*self.events, ServiceEvent("Running", "Health check successful", time.time())][-MAX_EVENTS:]
        self._set_health(True, "")
        self._task = None
        player = self.player
        if player is not None:
            player()
