"""cosi.resource.State/Watch of an emulated machine, as COSI's state server answers it: an empty
response once the watch runs; for one resource its current state first (Created, or Destroyed
when it does not exist); for a kind, with bootstrap_contents, Created for each resource there is
and then Bootstrapped (API version 1); then each change as Created, Updated (with the old
resource) or Destroyed. Changes are found by looking at what Get and List serve every POLL
seconds; the watch ends when the machine goes down, as its connection would."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from lab.talos_node.call import Call
from lab.talos_node.cosi_api import CosiApi
from lab.talos_node.node import EmulatedNode
from protos.gen.v1alpha1 import resource_pb2, state_pb2

POLL = 0.5
_E = state_pb2.EventType


def _event(kind: int, resource: resource_pb2.Resource | None = None,
           old: resource_pb2.Resource | None = None) -> state_pb2.WatchResponse:
    event = state_pb2.Event(event_type=kind)
    if resource is not None:
        event.resource.CopyFrom(resource)
    if old is not None:
        event.old.CopyFrom(old)
    return state_pb2.WatchResponse(event=[event])


def _tombstone(request) -> resource_pb2.Resource:
    """What COSI sends for a watched resource that does not exist: its metadata, no spec."""
    return resource_pb2.Resource(metadata=resource_pb2.Metadata(
        namespace=request.namespace, type=request.type, id=request.id, version="undefined", phase="running"),
        spec=resource_pb2.Spec())


def _same(a: resource_pb2.Resource, b: resource_pb2.Resource) -> bool:
    return a.metadata.version == b.metadata.version and a.spec.SerializeToString() == b.spec.SerializeToString()


class CosiWatchApi:
    def __init__(self, node: EmulatedNode) -> None:
        self.node = node

    async def _now(self, call: Call, request) -> dict[str, resource_pb2.Resource]:
        """What the watch covers now, by id."""
        api = CosiApi(self.node)
        if request.HasField("id"):
            get = state_pb2.GetRequest(namespace=request.namespace, type=request.type, id=request.id)
            try:
                return {request.id: (await api.cosi_get(call, get)).resource}
            except GRPCError as error:
                if error.status == Status.NOT_FOUND:
                    return {}
                raise
        options = state_pb2.ListOptions(label_query=request.options.label_query, id_query=request.options.id_query)
        listing = state_pb2.ListRequest(namespace=request.namespace, type=request.type, options=options)
        return {r.resource.metadata.id: r.resource async for r in api.cosi_list(call, listing)}

    async def cosi_watch(self, call: Call, request) -> AsyncIterator[state_pb2.WatchResponse]:
        if request.HasField("id") and (request.options.bootstrap_contents or request.options.label_query):
            raise GRPCError(Status.UNIMPLEMENTED, "bootstrap contents is not implemented for resource watch")
        current = await self._now(call, request)
        yield state_pb2.WatchResponse()
        if request.HasField("id"):
            found = current.get(request.id)
            yield _event(_E.CREATED, found) if found is not None else _event(_E.DESTROYED, _tombstone(request))
        elif request.options.bootstrap_contents:
            for rid in sorted(current):
                yield _event(_E.CREATED, current[rid])
            if request.api_version >= 1:
                yield _event(_E.BOOTSTRAPPED)
        boot = self.node.boot_id
        while self.node.boot_id == boot and self.node.is_up:
            await asyncio.sleep(POLL)
            now = await self._now(call, request)
            for rid in sorted(set(current) | set(now)):
                old, new = current.get(rid), now.get(rid)
                if old is None and new is not None:
                    yield _event(_E.CREATED, new)
                elif new is None and old is not None:
                    yield _event(_E.DESTROYED, old)
                elif old is not None and new is not None and not _same(old, new):
                    yield _event(_E.UPDATED, new, old)
            current = now
