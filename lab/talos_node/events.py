"""MachineService.Events of an emulated machine: what machined publishes, derived from what the
node does, so Talos's own clients (talosctl's reboot/upgrade tracker, `talosctl events`) follow
it as on a real node (failure-facts §2).

- Every boot starts an empty buffer (event_stream.py) holding that boot's history: the
  initialize and boot sequences with some of their phases, each service reaching Running
  (ServiceStateEvent), and MachineStatusEvents (booting, not ready; then the status now).
- While the node runs, each change of its MachineStatus (stage, ready, unmet conditions) is
  published, and what the node records in its event log: a reboot starts the `reboot` sequence
  (SequenceEvent START, then the cleanup and stopEverything phases; the stream then ends with the
  connection, as a machine going down ends it).
- A Reboot request publishes its sequence start under the request's actor ID before the reply
  goes out, as machined does, so a tracker that watches that actor reconnects on it.

The stage and readiness come from the lab's MachineStatus (machine_status.py), as the COSI
resource shows them; each change is an event.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import AsyncIterator

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from lab.talos_node import machine_status as machine_stage
from lab.talos_node import services as machine_services
from lab.talos_node.call import Call
from lab.talos_node.event_stream import EventBuffer, hello
from lab.talos_node.node import EmulatedNode
from lab.talos_node.upgrade import UpgradeApi
from protos.gen.machine import machine_pb2

POLL = 0.1  # seconds between looks at the node while a watcher waits
_M = machine_pb2
STAGES = {name.lower().replace("_", " "): value for name, value in _M.MachineStatusEvent.MachineStage.items()}
_SEQ, _PHASE, _TASK = _M.SequenceEvent, _M.PhaseEvent, _M.TaskEvent
_streams: weakref.WeakKeyDictionary[EmulatedNode, MachineEvents] = weakref.WeakKeyDictionary()


def machine_status(node: EmulatedNode) -> tuple[str, bool, list[dict]]:
    """(stage, ready, unmetConditions): the machine's MachineStatus, as its COSI resource shows it."""
    return machine_stage.status(node)


def services(node: EmulatedNode) -> list[tuple[str, str, bool]]:
    """(id, state, healthy) of the services a configured machine runs, as ServiceList shows them."""
    if node.config is None or node.mode != "configured":
        return []
    return [(s.id, s.state, s.healthy) for s in machine_services.of(node)]


def _status_event(status: tuple[str, bool, list[dict]]) -> _M.MachineStatusEvent:
    stage, ready, unmet = status
    return _M.MachineStatusEvent(stage=STAGES.get(stage, 0), status=_M.MachineStatusEvent.MachineStatus(
        ready=ready, unmet_conditions=[_M.MachineStatusEvent.MachineStatus.UnmetCondition(**c) for c in unmet]))


class MachineEvents:
    """The machine's event buffer kept in step with the node (on the lab's loop)."""

    def __init__(self) -> None:
        self.boot_id = ""
        self.buffer = EventBuffer()
        self._seen = 0  # entries of node.events already turned into events
        self._status: tuple | None = None
        self._rebooting = False  # the reboot sequence has started this boot

    def sync(self, node: EmulatedNode) -> None:
        """Publish what happened since the last look: a new boot, log entries, status changes."""
        log = node.event_log()
        if node.boot_id != self.boot_id and node.mode in ("maintenance", "configured"):
            self._boot(node)
            booted = [i for i, entry in enumerate(log) if entry["event"] == "booted"]
            self._seen = booted[-1] + 1 if booted else len(log)  # what came before is another boot's
        for entry in log[self._seen:]:
            if entry["event"] == "reboot":
                self.reboot_started(node, "")
        self._seen = len(log)
        self._publish_status(node)

    def _boot(self, node: EmulatedNode) -> None:
        self.boot_id, self.buffer, self._status, self._rebooting = node.boot_id, EventBuffer(), None, False
        at = node.booted_at.ToNanoseconds() / 1e9
        pub = self.buffer.publish
        pub(_SEQ(sequence="initialize", action=_SEQ.START), at=at)
        for phase in ("machined", "config", "earlyServices", "meta"):
            pub(_PHASE(phase=phase, action=_PHASE.START), at=at)
            pub(_PHASE(phase=phase, action=_PHASE.STOP), at=at)
        pub(_SEQ(sequence="initialize", action=_SEQ.STOP), at=at)
        if node.mode == "maintenance":
            return
        booting = ("booting", False, [{"name": "services", "reason": "kubelet not running"}])
        pub(_status_event(booting), at=at)
        self._status = ("booting", False, (("services", "kubelet not running"),))
        pub(_SEQ(sequence="boot", action=_SEQ.START), at=at)
        pub(_PHASE(phase="startEverything", action=_PHASE.START), at=at)
        pub(_TASK(task="startAllServices", action=_TASK.START), at=at)
        for name, state, healthy in services(node):
            action = _M.ServiceStateEvent.Action.Value(state.upper()) if state.upper() in _M.ServiceStateEvent.Action.keys() \
                else _M.ServiceStateEvent.WAITING
            pub(_M.ServiceStateEvent(service=name, action=action, message=f"Service {state.lower()}",
                                     health=_M.ServiceHealth(healthy=healthy)), at=at)
        pub(_TASK(task="startAllServices", action=_TASK.STOP), at=at)
        pub(_PHASE(phase="startEverything", action=_PHASE.STOP), at=at)
        pub(_SEQ(sequence="boot", action=_SEQ.STOP), at=at)

    def reboot_started(self, node: EmulatedNode, actor_id: str) -> None:
        """The reboot sequence begins (once per boot): machined publishes it under the actor that
        asked for it; the machine then goes down."""
        if self._rebooting or node.boot_id != self.boot_id:
            return
        self._rebooting = True
        pub = self.buffer.publish
        pub(_SEQ(sequence="reboot", action=_SEQ.START), actor_id)
        self._publish_status(node, ("rebooting", True, []))
        for phase, task in (("cleanup", "stopAllPods"), ("dbus", "stopDBus"), ("stopEverything", "stopAllServices")):
            pub(_PHASE(phase=phase, action=_PHASE.START), actor_id)
            pub(_TASK(task=task, action=_TASK.START), actor_id)
            pub(_TASK(task=task, action=_TASK.STOP), actor_id)
            pub(_PHASE(phase=phase, action=_PHASE.STOP), actor_id)

    def _publish_status(self, node: EmulatedNode, status: tuple | None = None) -> None:
        if self._rebooting and status is None:
            return  # the machine is going down: its stage stays rebooting
        status = status or machine_status(node)
        key = (status[0], status[1], tuple((c["name"], c["reason"]) for c in status[2]))
        if key != self._status:
            self._status = key
            self.buffer.publish(_status_event(status))


def of(node: EmulatedNode) -> MachineEvents:
    """The node's event stream, brought up to date."""
    stream = _streams.get(node)
    if stream is None:
        stream = _streams[node] = MachineEvents()
    stream.sync(node)
    return stream


class EventsApi:
    """MachineService.Events, and Reboot publishing its sequence under its actor ID."""

    def __init__(self, node: EmulatedNode) -> None:
        self.node = node

    async def events(self, call: Call, request) -> AsyncIterator[_M.Event]:
        node = self.node
        stream = of(node)
        try:
            pos = stream.buffer.start(request)
        except ValueError as exc:
            raise GRPCError(Status.UNKNOWN, f"error parsing tail_id: {exc}") from None
        yield hello(request.with_actor_id)
        boot, buffer = stream.boot_id, stream.buffer
        while True:
            for event in buffer.since(pos):
                pos += 1
                if not request.with_actor_id or event.actor_id == request.with_actor_id:
                    yield event.to_proto()
            await buffer.wait(POLL)
            stream.sync(node)
            if stream.boot_id != boot or not node.is_up:
                return  # the machine went down: its stream ends with it

    async def reboot(self, call: Call, request) -> _M.RebootResponse:
        reply = await UpgradeApi(self.node).reboot(call, request)
        of(self.node).reboot_started(self.node, reply.messages[0].actor_id)
        await asyncio.sleep(0)  # let watchers take the sequence's start before the machine goes down
        return reply
