"""The emulated node's gRPC surface: which method is served in which mode to which role, how
`node`/`nodes` metadata is routed, and the glue to grpclib.

Admission follows apid and machined (facts §2, §7, §8):
- every call is counted (a dry-run apply as ApplyConfigurationDryRun) and meets the node's fault
  knobs first;
- maintenance mode gives every client the os:reader role; Version, Upgrade and Reset answer
  Unimplemented "API is not implemented in maintenance mode", the other configured-only
  methods "method X not implemented", ClusterService "unknown service";
- configured mode takes roles from the client certificate's Organization values, requires its
  ExtKeyUsage to be exactly ClientAuth, and answers PermissionDenied "not authorized" to a
  role the method does not allow (Talos's own table, authz.py; also for the methods the lab
  does not serve, before their Unimplemented);
- `node` proxies one-to-one and `nodes` fans out (unary replies aggregated, each message's
  metadata.hostname set, a failed target reported in metadata.error), both only to nodes
  of the same Lab; COSI refuses `nodes`; maintenance mode does no forwarding at all.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator

import grpclib.const
from google.protobuf import empty_pb2
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from lab.talos_node import authz, dial, tls
from lab.talos_node.api import NodeApi
from lab.talos_node.call import Call
from lab.talos_node.cosi_api import CosiApi
from lab.talos_node.cosi_watch import CosiWatchApi
from lab.talos_node.etcd_status import EtcdStatusApi
from lab.talos_node.events import EventsApi
from lab.talos_node.logs import LogsApi
from lab.talos_node.node import EmulatedNode
from lab.talos_node.upgrade import UpgradeApi
from protos.gen.cluster import cluster_pb2
from protos.gen.common import common_pb2
from protos.gen.machine import image_pb2, lifecycle_pb2, machine_pb2
from protos.gen.v1alpha1 import state_pb2

MAINTENANCE_ROLES = frozenset({"os:reader"})

# How maintenance mode treats a method.
SERVE, ADMIN_ONLY, NOT_IMPLEMENTED, UNKNOWN_SERVICE = "serve", "admin-only", "not-implemented", "unknown-service"


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    handler: str  # a NodeApi method, or `<owner>.<method>` of an API in _OWNERS
    request: type
    reply: type
    maintenance: str
    streaming: bool = False  # server stream
    client_streaming: bool = False  # client stream: the handler gets the list of request messages

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def roles(self) -> frozenset[str]:
        """Who may call it: Talos's own table (authz.py)."""
        return authz.allowed(self.path)

    @property
    def cosi(self) -> bool:
        return self.service.startswith("cosi.")


_M = machine_pb2
METHODS = [
    Method("machine.MachineService", "ApplyConfiguration", "apply_configuration", _M.ApplyConfigurationRequest, _M.ApplyConfigurationResponse, SERVE),
    Method("machine.MachineService", "Bootstrap", "bootstrap", _M.BootstrapRequest, _M.BootstrapResponse, NOT_IMPLEMENTED),
    Method("machine.MachineService", "EtcdMemberList", "etcd_member_list", _M.EtcdMemberListRequest, _M.EtcdMemberListResponse, NOT_IMPLEMENTED),
    Method("machine.MachineService", "EtcdRemoveMemberByID", "etcd_remove_member_by_id", _M.EtcdRemoveMemberByIDRequest, _M.EtcdRemoveMemberByIDResponse, NOT_IMPLEMENTED),
    Method("machine.MachineService", "EtcdLeaveCluster", "etcd_leave_cluster", _M.EtcdLeaveClusterRequest, _M.EtcdLeaveClusterResponse, NOT_IMPLEMENTED),
    Method("machine.MachineService", "EtcdSnapshot", "etcd_snapshot", _M.EtcdSnapshotRequest, common_pb2.Data, NOT_IMPLEMENTED, streaming=True),
    Method("machine.MachineService", "EtcdRecover", "etcd_recover", common_pb2.Data, _M.EtcdRecoverResponse, NOT_IMPLEMENTED, client_streaming=True),
    Method("machine.MachineService", "ImagePull", "upgrades.legacy_image_pull", _M.ImagePullRequest, _M.ImagePullResponse, NOT_IMPLEMENTED),
    Method("machine.MachineService", "Kubeconfig", "kubeconfig", empty_pb2.Empty, common_pb2.Data, NOT_IMPLEMENTED, streaming=True),
    Method("machine.MachineService", "Reset", "reset", _M.ResetRequest, _M.ResetResponse, ADMIN_ONLY),
    Method("machine.MachineService", "ServiceList", "service_list", empty_pb2.Empty, _M.ServiceListResponse, NOT_IMPLEMENTED),
    Method("machine.MachineService", "Upgrade", "upgrade", _M.UpgradeRequest, _M.UpgradeResponse, ADMIN_ONLY),
    Method("machine.MachineService", "Version", "version", empty_pb2.Empty, _M.VersionResponse, ADMIN_ONLY),
    Method("machine.MachineService", "Read", "upgrades.read", _M.ReadRequest, common_pb2.Data, NOT_IMPLEMENTED, streaming=True),
    Method("machine.MachineService", "Reboot", "events.reboot", _M.RebootRequest, _M.RebootResponse, NOT_IMPLEMENTED),
    Method("machine.MachineService", "Events", "events.events", _M.EventsRequest, _M.Event, NOT_IMPLEMENTED, streaming=True),
    Method("machine.MachineService", "EtcdStatus", "etcd.etcd_status", empty_pb2.Empty, _M.EtcdStatusResponse, NOT_IMPLEMENTED),
    Method("machine.MachineService", "EtcdAlarmList", "etcd.etcd_alarm_list", empty_pb2.Empty, _M.EtcdAlarmListResponse, NOT_IMPLEMENTED),
    Method("machine.MachineService", "Logs", "logs.logs", _M.LogsRequest, common_pb2.Data, NOT_IMPLEMENTED, streaming=True),
    Method("machine.MachineService", "Dmesg", "logs.dmesg", _M.DmesgRequest, common_pb2.Data, NOT_IMPLEMENTED, streaming=True),
    Method("machine.ImageService", "Pull", "upgrades.image_pull", image_pb2.ImageServicePullRequest, image_pb2.ImageServicePullResponse, UNKNOWN_SERVICE, streaming=True),
    Method("machine.LifecycleService", "Upgrade", "upgrades.lifecycle_upgrade", lifecycle_pb2.LifecycleServiceUpgradeRequest, lifecycle_pb2.LifecycleServiceUpgradeResponse, UNKNOWN_SERVICE, streaming=True),
    Method("cluster.ClusterService", "HealthCheck", "health_check", cluster_pb2.HealthCheckRequest, cluster_pb2.HealthCheckProgress, UNKNOWN_SERVICE, streaming=True),
    Method("cosi.resource.State", "Get", "cosi.cosi_get", state_pb2.GetRequest, state_pb2.GetResponse, SERVE),
    Method("cosi.resource.State", "List", "cosi.cosi_list", state_pb2.ListRequest, state_pb2.ListResponse, SERVE, streaming=True),
    Method("cosi.resource.State", "Watch", "cosi_watch.cosi_watch", state_pb2.WatchRequest, state_pb2.WatchResponse, SERVE, streaming=True),
]
_OWNERS = {"upgrades": UpgradeApi, "events": EventsApi, "etcd": EtcdStatusApi, "logs": LogsApi, "cosi": CosiApi,
           "cosi_watch": CosiWatchApi}


def _handler(node: EmulatedNode, method: Method) -> Any:
    """The bound handler on `node`: a NodeApi method, or one of an API in _OWNERS (`owner.x`)."""
    owner, _, name = method.handler.rpartition(".")
    return getattr(_OWNERS[owner](node) if owner else NodeApi(node), name)


def _roles(node: EmulatedNode, method: Method, peer_der: bytes | None) -> frozenset[str]:
    """Who the caller is and whether this mode lets them make the call."""
    if node.mode == "maintenance":
        if method.maintenance == UNKNOWN_SERVICE:
            raise GRPCError(Status.UNIMPLEMENTED, f"unknown service {method.service}")
        if method.maintenance == NOT_IMPLEMENTED:
            raise GRPCError(Status.UNIMPLEMENTED, f"method {method.name} not implemented")
        if method.maintenance == ADMIN_ONLY:  # admin would need SideroLink, which the lab lacks
            raise GRPCError(Status.UNIMPLEMENTED, "API is not implemented in maintenance mode")
        return MAINTENANCE_ROLES
    if peer_der is None:
        raise GRPCError(Status.UNAUTHENTICATED, "no client certificate")
    identity = tls.client_identity(peer_der)
    if not identity.client_auth_only or not (identity.roles & method.roles):
        raise GRPCError(Status.PERMISSION_DENIED, "not authorized")
    return identity.roles


def _targets(node: EmulatedNode, method: Method, metadata: Any) -> tuple[list[str] | None, bool]:
    """(targets, fan_out) from the request metadata; (None, False) means handle locally."""
    nodes = [v for value in metadata.getall("nodes", []) for v in str(value).split(",") if v]
    single = metadata.getall("node", [])
    if len(single) > 1:
        raise GRPCError(Status.INVALID_ARGUMENT, "node metadata must be a single value")
    if nodes and method.cosi:
        raise GRPCError(Status.INVALID_ARGUMENT, f"one-to-many proxying is not supported for {method.path}")
    targets = nodes or list(single)
    if not targets:
        return None, False
    local = (node.address, node.hostname)
    if node.mode == "maintenance" and any(t not in local for t in targets):
        raise GRPCError(Status.PERMISSION_DENIED, "no request forwarding")
    return targets, bool(nodes)


async def _resolve(node: EmulatedNode, target: str) -> EmulatedNode:
    """The node a proxied call reaches: itself, or another node of the same Lab and cluster. A
    crashed one is dialled until grpc-go gives up (the caller's deadline usually ends it first)."""
    if target in (node.address, node.hostname):
        return node
    other = node.registry.node(target)
    if other is not None and other.mode == "crashed":
        await asyncio.sleep(dial.DIAL_TIMEOUT)
        raise GRPCError(Status.UNAVAILABLE, dial.timed_out(target, other.port))
    if other is None or not other.is_up:
        raise GRPCError(Status.UNAVAILABLE, dial.refused(target, node.port))
    if other.mode != "configured" or other.cluster_key != node.cluster_key:
        raise GRPCError(
            Status.UNAVAILABLE,
            f'connection error: desc = "transport: authentication handshake failed: {target} does not trust this cluster"',
        )
    return other


async def _admit_forwarded(target: EmulatedNode, origin: EmulatedNode, method: Method) -> None:
    """What the proxied-to node does with a call apid forwards to it."""
    if target is origin:
        return
    target.count(method.name)
    await target.inject_faults()


def _failed(method: Method, target: str, error: GRPCError) -> Any:
    meta = common_pb2.Metadata(
        hostname=target,
        error=error.message or error.status.name,
        status=common_pb2.RpcStatus(code=error.status.value, message=error.message or ""),
    )
    if method.streaming:
        return method.reply(metadata=meta)
    reply = method.reply()
    reply.messages.add(metadata=meta)
    return reply


def counted(method: Method, request: Any) -> str:
    """The name a call is counted under: a dry run changes nothing, so it is told apart."""
    if method.name == "ApplyConfiguration" and getattr(request, "dry_run", False):
        return "ApplyConfigurationDryRun"
    return method.name


async def unary(node: EmulatedNode, method: Method, request: Any, metadata: Any, peer_der: bytes | None, call: Call) -> Any:
    node.count(counted(method, request))
    await node.inject_faults()
    call.roles = _roles(node, method, peer_der)
    targets, fan_out = _targets(node, method, metadata)
    if targets is None:
        return await _handler(node, method)(call, request)
    if not fan_out:
        target = await _resolve(node, targets[0])
        await _admit_forwarded(target, node, method)
        return await _handler(target, method)(call, request)
    reply = method.reply()
    for name in targets:
        try:
            target = await _resolve(node, name)
            await _admit_forwarded(target, node, method)
            part = await _handler(target, method)(call, request)
        except GRPCError as error:
            part = _failed(method, name, error)
        for message in part.messages:
            message.metadata.hostname = name
            reply.messages.append(message)
    return reply


async def stream(
    node: EmulatedNode, method: Method, request: Any, metadata: Any, peer_der: bytes | None, call: Call
) -> AsyncIterator[Any]:
    node.count(method.name)
    await node.inject_faults()
    call.roles = _roles(node, method, peer_der)
    targets, fan_out = _targets(node, method, metadata)
    if targets is None or not fan_out:
        target = node if targets is None else await _resolve(node, targets[0])
        await _admit_forwarded(target, node, method)
        async for message in _handler(target, method)(call, request):
            yield message
        return
    for name in targets:
        try:
            target = await _resolve(node, name)
            await _admit_forwarded(target, node, method)
            async for message in _handler(target, method)(call, request):
                if "metadata" in message.DESCRIPTOR.fields_by_name:
                    message.metadata.hostname = name
                yield message
        except GRPCError as error:
            if "metadata" not in method.reply.DESCRIPTOR.fields_by_name:
                raise
            yield _failed(method, name, error)


class _NodeService:
    """grpclib handler object serving every method of METHODS for one node."""

    def __init__(self, node: EmulatedNode) -> None:
        self._node = node

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {
            m.path: grpclib.const.Handler(
                self._adapter(m),
                Cardinality.STREAM_UNARY if m.client_streaming else
                Cardinality.UNARY_STREAM if m.streaming else Cardinality.UNARY_UNARY,
                m.request,
                m.reply,
            )
            for m in METHODS
        }

    def _adapter(self, method: Method):
        node = self._node

        async def handle(grpc_stream: Any) -> None:
            if method.client_streaming:
                request = [message async for message in grpc_stream]
            else:
                request = await grpc_stream.recv_message()
            call = Call(roles=frozenset())
            args = (node, method, request, grpc_stream.metadata, tls.peer_certificate(grpc_stream), call)
            if method.streaming:
                async for message in stream(*args):
                    await grpc_stream.send_message(message)
            else:
                await grpc_stream.send_message(await unary(*args))
            # Finish the reply on the wire before anything it triggers (a reboot) happens.
            await grpc_stream.send_trailing_metadata()
            for action in call.after_reply:
                action()

        return handle


def service_for(node: EmulatedNode) -> _NodeService:
    return _NodeService(node)
