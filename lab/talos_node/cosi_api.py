"""cosi.resource.State Get and List of an emulated machine: machined's access policy first (a
sensitive resource type is for os:admin only: PermissionDenied "not authorized", as
internal/app/resources/access.go answers), then the resources built from the node's cluster and
secrets (cluster_resources.py) here, every other type by NodeApi (api.py). A MachineStatus that
NodeApi serves in YAML only also gets its protobuf form, which Talos's Go clients decode (its
stage and readiness columns in `talosctl get machinestatus`), and so do the MachineConfig
(MachineConfigSpec{yaml_marshalled}: talosctl upgrade-k8s patches the config it reads there) and
a Service (ServiceSpec: upgrade-k8s and rotate-ca wait for the kubelet's to be healthy)."""

from __future__ import annotations

import re
from typing import AsyncIterator

import yaml

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from lab.talos_node import cluster_resources, resources
from lab.talos_node.api import NodeApi
from lab.talos_node.call import Call
from lab.talos_node.node import EmulatedNode
from protos.gen.definitions import resources_pb2 as defs
from protos.gen.v1alpha1 import resource_pb2, state_pb2


def machine_status_proto(yaml_spec: str) -> bytes:
    """MachineStatusSpec{stage, status{ready, unmetConditions}} of its YAML form."""
    spec = yaml.safe_load(yaml_spec) or {}
    status = spec.get("status") or {}
    stage = "MACHINE_STAGE_" + str(spec.get("stage") or "unknown").upper().replace(" ", "_")
    return defs.MachineStatusSpec(
        stage=defs.RuntimeMachineStage.Value(stage) if stage in defs.RuntimeMachineStage.keys() else 0,
        status=defs.MachineStatusStatus(ready=bool(status.get("ready")), unmet_conditions=[
            defs.UnmetCondition(name=c.get("name", ""), reason=c.get("reason", "")) for c in status.get("unmetConditions") or []]),
    ).SerializeToString()


def _service_proto(yaml_spec: str) -> bytes:
    spec = yaml.safe_load(yaml_spec) or {}
    return defs.ServiceSpec(running=bool(spec.get("running")), healthy=bool(spec.get("healthy")),
                            unknown=bool(spec.get("unknown"))).SerializeToString()


_FROM_YAML = {
    resources.MACHINE_STATUS: machine_status_proto,
    resources.MACHINE_CONFIG: lambda text: defs.MachineConfigSpec(yaml_marshalled=text.encode()).SerializeToString(),
    resources.SERVICE: _service_proto,
}


def _with_proto(resource: resource_pb2.Resource) -> resource_pb2.Resource:
    """Fill in the protobuf spec of a resource served in YAML only, where we know its encoding."""
    encode = _FROM_YAML.get(resource.metadata.type)
    if encode is not None and not resource.spec.proto_spec:
        resource.spec.proto_spec = encode(resource.spec.yaml_spec)
    return resource


class CosiApi:
    def __init__(self, node: EmulatedNode) -> None:
        self.node = node

    def _admit(self, call: Call, rtype: str) -> bool:
        """Whether this module serves `rtype` here; refuses a sensitive read without os:admin."""
        definition = resources.DEFINITIONS.get(rtype)
        if definition is not None and definition.sensitive and "os:admin" not in call.roles \
                and self.node.mode != "maintenance":
            raise GRPCError(Status.PERMISSION_DENIED, "not authorized")
        return rtype in cluster_resources.TYPES and self.node.mode != "maintenance"

    def _resource(self, request, rid: str, spec: dict, proto: bytes):
        found = resources.resource(request.namespace, request.type, rid, spec, proto, self.node.booted_at)
        found.metadata.version = cluster_resources.version(self.node, request.type)
        return found

    async def cosi_get(self, call: Call, request) -> state_pb2.GetResponse:
        if not self._admit(call, request.type):
            reply = await NodeApi(self.node).cosi_get(call, request)
            _with_proto(reply.resource)
            return reply
        found = self._specs(request).get(request.id)
        if found is None:
            raise GRPCError(
                Status.NOT_FOUND, f"resource {request.type}({request.namespace}/{request.id}@undefined) doesn't exist"
            )
        return state_pb2.GetResponse(resource=self._resource(request, request.id, *found))

    async def cosi_list(self, call: Call, request) -> AsyncIterator[state_pb2.ListResponse]:
        if not self._admit(call, request.type):
            async for reply in NodeApi(self.node).cosi_list(call, request):
                _with_proto(reply.resource)
                yield reply
            return
        items = self._specs(request)
        pattern = re.compile(request.options.id_query.regexp) if request.options.id_query.regexp else None
        for rid in sorted(items):
            if pattern is not None and not pattern.search(rid):
                continue
            if any(t.op != t.NOT_EXISTS for q in request.options.label_query for t in q.terms):
                continue  # these resources carry no labels, so only NOT_EXISTS terms can match
            yield state_pb2.ListResponse(resource=self._resource(request, rid, *items[rid]))

    def _specs(self, request) -> cluster_resources.Specs:
        namespace = resources.DEFINITIONS[request.type].namespace
        if request.namespace != namespace:
            return {}
        return cluster_resources.specs(self.node, request.type)
