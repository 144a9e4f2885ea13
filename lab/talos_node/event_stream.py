"""machined's runtime event buffer, as Talos 1.13 keeps it (internal/app/machined/pkg/runtime/
v1alpha1/v1alpha1_events.go, runtime/events.go): an in-memory ring of 1000 events of which the
last 990 can be replayed, so it starts empty at every boot; each event has an xid (time-ordered,
20 characters) and the actor ID of the request that caused it.

A watcher starts at the next event, or, asked for a tail: the last N events (N < 0: all kept),
those after a given event ID, or those of the last N seconds; with an actor ID it sees only that
actor's events.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import time
from dataclasses import dataclass

from google.protobuf import any_pb2
from google.protobuf.message import Message

from protos.gen.machine import machine_pb2

CAPACITY, GAP = 1000, 10  # NewEvents(1000, 10)
TYPE_URL = "talos/runtime/{}"  # + the payload's full name, e.g. machine.MachineStatusEvent
_XID_ALPHABET = "0123456789abcdefghijklmnopqrstuv"  # rs/xid: base32hex, lower case
_MACHINE = secrets.token_bytes(3)
_PID = (os.getpid() & 0xFFFF).to_bytes(2, "big")
_COUNTER = itertools.count(int.from_bytes(secrets.token_bytes(3), "big"))


def new_xid(at: float | None = None) -> str:
    """An rs/xid ID: 4 bytes of Unix seconds, 3 of machine, 2 of process, 3 of counter."""
    raw = (int(at if at is not None else time.time()).to_bytes(4, "big") + _MACHINE + _PID
           + (next(_COUNTER) & 0xFFFFFF).to_bytes(3, "big"))
    number = int.from_bytes(raw, "big") << 4  # 96 bits as 20 five-bit digits (the last padded)
    return "".join(_XID_ALPHABET[(number >> (5 * i)) & 31] for i in range(19, -1, -1))


def xid_bytes(xid: str) -> bytes:
    """The 12 raw bytes of an xid, or ValueError (what Talos answers as "error parsing tail_id")."""
    if len(xid) != 20 or any(c not in _XID_ALPHABET for c in xid):
        raise ValueError(f"xid: invalid ID {xid!r}")
    number = 0
    for c in xid:
        number = number << 5 | _XID_ALPHABET.index(c)
    return (number >> 4).to_bytes(12, "big")


@dataclass(frozen=True)
class Event:
    id: str
    at: float
    actor_id: str
    payload: Message

    def to_proto(self) -> machine_pb2.Event:
        data = any_pb2.Any(type_url=TYPE_URL.format(self.payload.DESCRIPTOR.full_name),
                           value=self.payload.SerializeToString())
        return machine_pb2.Event(data=data, id=self.id, actor_id=self.actor_id)


def hello(actor_id: str) -> machine_pb2.Event:
    """The empty event Talos sends first, so a client knows the watch has started."""
    return machine_pb2.Event(data=any_pb2.Any(), id=new_xid(), actor_id=actor_id)


class EventBuffer:
    """One boot's events. Used on the lab's event loop only."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._written = 0  # events published since boot (positions are absolute)
        self._changed = asyncio.Event()

    @property
    def written(self) -> int:
        return self._written

    def publish(self, payload: Message, actor_id: str = "", at: float | None = None) -> Event:
        at = time.time() if at is None else at
        event = Event(new_xid(at), at, actor_id, payload)
        self._events.append(event)
        self._written += 1
        del self._events[:-(CAPACITY - GAP)]
        self._changed.set()
        self._changed = asyncio.Event()
        return event

    def _first(self) -> int:
        return self._written - len(self._events)

    def start(self, request: machine_pb2.EventsRequest) -> int:
        """Where a watcher begins, by the request's tail options (in Talos's order of precedence)."""
        first, pos = self._first(), self._written
        if request.tail_events:
            return first if request.tail_events < 0 else max(pos - request.tail_events, first)
        if request.tail_id:
            after = xid_bytes(request.tail_id)
            return first + sum(1 for e in self._events if xid_bytes(e.id) <= after)
        if request.tail_seconds:
            since = time.time() - request.tail_seconds
            return first + sum(1 for e in self._events if int(e.at) <= since)
        return pos

    def since(self, pos: int) -> list[Event]:
        return self._events[max(pos - self._first(), 0):]

    async def wait(self, timeout: float) -> None:
        """Until the next publish, or `timeout` seconds."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
