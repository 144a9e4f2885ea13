"""Talos API client: the calls Kontinuum makes to a node, each with a deadline and typed errors.

Usage from ordinary (non-async) code, e.g. a dynamic provider:

    node = TalosClient.maintenance("10.5.0.2")
    info = node.discover()
    node.apply_config(config_yaml)

    cp = TalosClient.from_talosconfig(talosconfig.parse(text), node="10.5.0.2")
    cp.bootstrap()
    kubeconfig = cp.kubeconfig()

Each operation opens its own connection in a short-lived event loop and closes it before
returning, so a client object holds no socket or loop and is safe to share between threads.
A maintenance client still pins the node's certificate across operations (transport.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import tarfile
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, TypeVar

import yaml
from google.protobuf import duration_pb2, empty_pb2
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from kontinuum.talos.answers import (
    ApplyResult,
    Discovery,
    EtcdMember,
    ServiceStatus,
    VersionInfo,
    address_of,
    check_messages,
    extract_kubeconfig,
    link_of,
    yaml_spec,
)
from kontinuum.talos.errors import (
    CertificatePinMismatch,
    ClientCertificateRejectedError,
    ClusterUnhealthyError,
    NotInMaintenanceError,
    TalosApiError,
    TalosError,
    classify,
)
from kontinuum.talos.talosconfig import APID_PORT
from kontinuum.talos.transport import MaintenanceTransport, MutualTlsTransport, Transport
from protos.gen.cluster import cluster_grpc, cluster_pb2
from protos.gen.machine import machine_grpc, machine_pb2
from protos.gen.v1alpha1 import state_grpc, state_pb2

T = TypeVar("T")

_TRANSPORT_ERRORS = (GRPCError, OSError, TimeoutError, StreamTerminatedError, ProtocolError, CertificatePinMismatch)

APPLY_MODES = {
    "reboot": machine_pb2.ApplyConfigurationRequest.REBOOT,
    "auto": machine_pb2.ApplyConfigurationRequest.AUTO,
    "no-reboot": machine_pb2.ApplyConfigurationRequest.NO_REBOOT,
    "staged": machine_pb2.ApplyConfigurationRequest.STAGED,
    "try": machine_pb2.ApplyConfigurationRequest.TRY,
}
WIPE_MODES = {
    "all": machine_pb2.ResetRequest.ALL,
    "system-disk": machine_pb2.ResetRequest.SYSTEM_DISK,
    "user-disks": machine_pb2.ResetRequest.USER_DISKS,
}


@dataclass(frozen=True)
class Deadlines:
    """Client-side deadline of every operation, in seconds: the one place the defaults live.
    Override per client (`TalosClient(..., deadlines=Deadlines(bootstrap=60))`) or per call
    (`timeout=`)."""

    discover: float = 10.0
    version: float = 10.0
    apply_config: float = 30.0
    bootstrap: float = 30.0
    kubeconfig: float = 30.0
    reset: float = 30.0
    etcd: float = 15.0
    service_list: float = 10.0
    upgrade: float = 60.0
    # health_check's deadline is its server-side wait_timeout plus this slack, so the node
    # reports its own verdict before we give up on it.
    health_check_slack: float = 30.0


DEFAULT_DEADLINES = Deadlines()


def run_sync(coro: Awaitable[T]) -> T:
    """Run `coro` to completion from synchronous code.

    Normally in a fresh event loop on the calling thread; from inside a running loop (where
    that is not allowed) on a helper thread. The coroutine carries its own deadline."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="talos-client") as pool:
        return pool.submit(asyncio.run, coro).result()  # type: ignore[arg-type]


class TalosClient:
    """Operations on one Talos node over one transport (maintenance or mTLS)."""

    def __init__(self, transport: Transport, *, deadlines: Deadlines | None = None) -> None:
        self._transport = transport
        self.deadlines = deadlines or DEFAULT_DEADLINES

    @classmethod
    def maintenance(
        cls,
        address: str,
        *,
        port: int = APID_PORT,
        fingerprint: str | None = None,
        deadlines: Deadlines | None = None,
    ) -> TalosClient:
        """Insecure client for a node in maintenance mode; pass `fingerprint` to pin a known
        certificate up front, else the first one seen is pinned."""
        return cls(MaintenanceTransport(address, port=port, fingerprint=fingerprint), deadlines=deadlines)

    @classmethod
    def from_talosconfig(
        cls,
        config: Any,
        *,
        node: str | None = None,
        endpoint: str | None = None,
        port: int = APID_PORT,
        deadlines: Deadlines | None = None,
    ) -> TalosClient:
        """Authenticated client from a parsed talosconfig (talosconfig.parse)."""
        transport = MutualTlsTransport.from_talosconfig(config, node=node, endpoint=endpoint, port=port)
        return cls(transport, deadlines=deadlines)

    @property
    def node(self) -> str:
        return self._transport.node

    @property
    def fingerprint(self) -> str | None:
        """The pinned maintenance certificate fingerprint (None for mTLS or before first use)."""
        return getattr(self._transport, "fingerprint", None)

    # --- plumbing -------------------------------------------------------------------------

    def _run(self, operation: str, timeout: float, body: Callable[[Any, dict, float], Awaitable[T]]) -> T:
        return run_sync(self._call(operation, timeout, body))

    async def _call(self, operation: str, timeout: float, body: Callable[[Any, dict, float], Awaitable[T]]) -> T:
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            async with asyncio.timeout(timeout):
                async with self._transport.channel() as channel:
                    return await body(channel, self._transport.metadata(), timeout)
        except _TRANSPORT_ERRORS as exc:
            maintenance = self._transport.maintenance
            error = classify(exc, node=self.node, operation=operation, timeout=timeout, maintenance=maintenance)
            if isinstance(exc, (StreamTerminatedError, CertificatePinMismatch)):
                # A lost connection right after the handshake, or a new certificate, is often
                # the node refusing our (absent) client certificate: ask it, within the deadline.
                left = max(0.2, min(2.0, deadline - asyncio.get_running_loop().time()))
                reason = await self._transport.rejection(left)
                if reason and maintenance:
                    problem = f"the node refuses clients without a certificate ({reason})"
                    error = NotInMaintenanceError(self.node, operation, problem)
                elif reason:
                    error = ClientCertificateRejectedError(self.node, operation, f"TLS session ended: {reason}")
            raise error from exc

    # --- maintenance-mode reads -----------------------------------------------------------

    def discover(self, *, timeout: float | None = None) -> Discovery:
        """Talos version, links and addresses, read as COSI resources: in maintenance mode the
        Version RPC is Unimplemented for anyone outside SideroLink."""

        async def body(channel: Any, md: dict, t: float) -> Discovery:
            state = state_grpc.StateStub(channel)
            got = await state.Get(
                state_pb2.GetRequest(namespace="runtime", type="Versions.runtime.talos.dev", id="version"),
                timeout=t,
                metadata=md,
            )
            links = await state.List(
                state_pb2.ListRequest(namespace="network", type="LinkStatuses.net.talos.dev"), timeout=t, metadata=md
            )
            addresses = await state.List(
                state_pb2.ListRequest(namespace="network", type="AddressStatuses.net.talos.dev"),
                timeout=t,
                metadata=md,
            )
            return Discovery(
                address=self.node,
                talos_version=str(yaml_spec(got.resource).get("version", "")),
                links=tuple(link_of(r.resource) for r in links),
                addresses=tuple(address_of(r.resource) for r in addresses),
                fingerprint=self.fingerprint,
            )

        return self._run("discover", timeout or self.deadlines.discover, body)

    def machine_config(self, *, timeout: float | None = None) -> str:
        """The node's active machine config (COSI MachineConfig v1alpha1, as talosctl rotate-ca
        reads it before each patch)."""

        async def body(channel: Any, md: dict, t: float) -> str:
            got = await state_grpc.StateStub(channel).Get(
                state_pb2.GetRequest(namespace="config", type="MachineConfigs.config.talos.dev", id="v1alpha1"),
                timeout=t,
                metadata=md,
            )
            return got.resource.spec.yaml_spec

        return self._run("get machineconfig", timeout or self.deadlines.version, body)

    def resource(self, namespace: str, rtype: str, rid: str, *, timeout: float | None = None) -> dict | list | None:
        """One COSI resource's spec as Talos serves it (its YAML form, parsed), None when the
        node has no such resource (talosctl `get <type> <id>`)."""

        async def body(channel: Any, md: dict, t: float) -> dict | list | None:
            try:
                got = await state_grpc.StateStub(channel).Get(
                    state_pb2.GetRequest(namespace=namespace, type=rtype, id=rid), timeout=t, metadata=md)
            except GRPCError as e:
                if e.status == Status.NOT_FOUND:
                    return None
                raise
            return yaml.safe_load(got.resource.spec.yaml_spec or "null")

        return self._run(f"get {rtype} {rid}", timeout or self.deadlines.version, body)

    # --- machine service ------------------------------------------------------------------

    def apply_config(
        self, data: bytes | str, *, mode: str = "auto", dry_run: bool = False, timeout: float | None = None
    ) -> ApplyResult:
        """Send a machine config. In maintenance mode only auto, reboot and try are served."""
        if mode not in APPLY_MODES:
            raise ValueError(f"apply mode must be one of {', '.join(APPLY_MODES)}, got {mode!r}")
        request = machine_pb2.ApplyConfigurationRequest(
            data=data.encode() if isinstance(data, str) else data, mode=APPLY_MODES[mode], dry_run=dry_run
        )

        async def body(channel: Any, md: dict, t: float) -> ApplyResult:
            reply = await machine_grpc.MachineServiceStub(channel).ApplyConfiguration(request, timeout=t, metadata=md)
            check_messages(reply.messages, self.node, "apply-config")
            first = reply.messages[0] if reply.messages else machine_pb2.ApplyConfiguration()
            return ApplyResult(
                mode=machine_pb2.ApplyConfigurationRequest.Mode.Name(first.mode).lower().replace("_", "-"),
                details=first.mode_details,
                warnings=tuple(first.warnings),
            )

        return self._run("apply-config", timeout or self.deadlines.apply_config, body)

    def bootstrap(self, *, recover_etcd: bool = False, timeout: float | None = None) -> None:
        """Start etcd on this control-plane node; raises AlreadyBootstrappedError if it ran before."""

        async def body(channel: Any, md: dict, t: float) -> None:
            reply = await machine_grpc.MachineServiceStub(channel).Bootstrap(
                machine_pb2.BootstrapRequest(recover_etcd=recover_etcd), timeout=t, metadata=md
            )
            check_messages(reply.messages, self.node, "bootstrap")

        self._run("bootstrap", timeout or self.deadlines.bootstrap, body)

    def kubeconfig(self, *, timeout: float | None = None) -> str:
        """The admin kubeconfig, which a control-plane node streams as a gzip-compressed tar."""

        async def body(channel: Any, md: dict, t: float) -> str:
            chunks = await machine_grpc.MachineServiceStub(channel).Kubeconfig(
                empty_pb2.Empty(), timeout=t, metadata=md
            )
            check_messages(chunks, self.node, "kubeconfig")
            try:
                return extract_kubeconfig(b"".join(c.bytes for c in chunks))
            except (OSError, EOFError, tarfile.TarError, ValueError, UnicodeDecodeError) as exc:
                raise TalosApiError(self.node, "kubeconfig", f"the node sent an unreadable archive ({exc})") from exc

        return self._run("kubeconfig", timeout or self.deadlines.kubeconfig, body)

    def reset(
        self,
        *,
        graceful: bool = True,
        reboot: bool = True,
        mode: str = "all",
        system_partitions: Iterable[str] = (),
        user_disks: Iterable[str] = (),
        timeout: float | None = None,
    ) -> str:
        """Wipe the node back to maintenance mode (reboot=False powers it off instead).
        graceful=True leaves etcd cleanly first. Returns the node's actor id for the reset."""
        if mode not in WIPE_MODES:
            raise ValueError(f"wipe mode must be one of {', '.join(WIPE_MODES)}, got {mode!r}")
        request = machine_pb2.ResetRequest(
            graceful=graceful,
            reboot=reboot,
            mode=WIPE_MODES[mode],
            system_partitions_to_wipe=[machine_pb2.ResetPartitionSpec(label=p, wipe=True) for p in system_partitions],
            user_disks_to_wipe=list(user_disks),
        )

        async def body(channel: Any, md: dict, t: float) -> str:
            reply = await machine_grpc.MachineServiceStub(channel).Reset(request, timeout=t, metadata=md)
            check_messages(reply.messages, self.node, "reset")
            return reply.messages[0].actor_id if reply.messages else ""

        return self._run("reset", timeout or self.deadlines.reset, body)

    def etcd_members(self, *, query_local: bool = False, timeout: float | None = None) -> list[EtcdMember]:
        async def body(channel: Any, md: dict, t: float) -> list[EtcdMember]:
            reply = await machine_grpc.MachineServiceStub(channel).EtcdMemberList(
                machine_pb2.EtcdMemberListRequest(query_local=query_local), timeout=t, metadata=md
            )
            check_messages(reply.messages, self.node, "etcd-members")
            return [
                EtcdMember(m.id, m.hostname, tuple(m.peer_urls), tuple(m.client_urls), m.is_learner)
                for message in reply.messages
                for m in message.members
            ]

        return self._run("etcd-members", timeout or self.deadlines.etcd, body)

    def etcd_leave(self, *, timeout: float | None = None) -> None:
        """Make this control-plane node leave the etcd cluster."""

        async def body(channel: Any, md: dict, t: float) -> None:
            reply = await machine_grpc.MachineServiceStub(channel).EtcdLeaveCluster(
                machine_pb2.EtcdLeaveClusterRequest(), timeout=t, metadata=md
            )
            check_messages(reply.messages, self.node, "etcd-leave")

        self._run("etcd-leave", timeout or self.deadlines.etcd, body)

    def etcd_remove_member(self, member_id: int, *, timeout: float | None = None) -> None:
        """Remove another (e.g. reset or lost) member from etcd through this node."""

        async def body(channel: Any, md: dict, t: float) -> None:
            reply = await machine_grpc.MachineServiceStub(channel).EtcdRemoveMemberByID(
                machine_pb2.EtcdRemoveMemberByIDRequest(member_id=member_id), timeout=t, metadata=md
            )
            check_messages(reply.messages, self.node, "etcd-remove-member")

        self._run("etcd-remove-member", timeout or self.deadlines.etcd, body)

    def upgrade(
        self, image: str, *, stage: bool = False, force: bool = False, timeout: float | None = None
    ) -> str:
        """Ask the node to install `image` and reboot into it; returns the node's acknowledgement.

        Uses MachineService.Upgrade, which Talos marks deprecated (LifecycleService.Upgrade
        replaces it) but still serves."""

        async def body(channel: Any, md: dict, t: float) -> str:
            reply = await machine_grpc.MachineServiceStub(channel).Upgrade(
                machine_pb2.UpgradeRequest(image=image, stage=stage, force=force), timeout=t, metadata=md
            )
            check_messages(reply.messages, self.node, "upgrade")
            return reply.messages[0].ack if reply.messages else ""

        return self._run("upgrade", timeout or self.deadlines.upgrade, body)

    def service_list(self, *, timeout: float | None = None) -> list[ServiceStatus]:
        async def body(channel: Any, md: dict, t: float) -> list[ServiceStatus]:
            reply = await machine_grpc.MachineServiceStub(channel).ServiceList(
                empty_pb2.Empty(), timeout=t, metadata=md
            )
            check_messages(reply.messages, self.node, "service-list")
            return [
                ServiceStatus(s.id, s.state, None if s.health.unknown else s.health.healthy,
                              tuple((e.state, e.ts.seconds + e.ts.nanos / 1e9) for e in s.events.events))
                for message in reply.messages
                for s in message.services
            ]

        return self._run("service-list", timeout or self.deadlines.service_list, body)

    def version(self, *, timeout: float | None = None) -> VersionInfo:
        """Talos version over the Version RPC (configured nodes; maintenance mode refuses it)."""

        async def body(channel: Any, md: dict, t: float) -> VersionInfo:
            reply = await machine_grpc.MachineServiceStub(channel).Version(empty_pb2.Empty(), timeout=t, metadata=md)
            check_messages(reply.messages, self.node, "version")
            if not reply.messages:
                raise TalosApiError(self.node, "version", "the node sent an empty reply")
            v = reply.messages[0]
            return VersionInfo(v.version.tag, v.version.sha, v.version.arch, v.platform.name, v.features.rbac)

        return self._run("version", timeout or self.deadlines.version, body)

    # --- cluster service ------------------------------------------------------------------

    def health_check(
        self,
        control_plane_nodes: Iterable[str],
        worker_nodes: Iterable[str] = (),
        *,
        wait_timeout: float = 600.0,
        on_progress: Callable[[str], None] | None = None,
        force_endpoint: str = "",
        timeout: float | None = None,
    ) -> list[str]:
        """Run Talos's server-side cluster health check through this node and wait, at most
        `wait_timeout` on the node plus Deadlines.health_check_slack, for it to pass.

        Each progress message goes to `on_progress` as it arrives; all are returned. Raises
        ClusterUnhealthyError, naming the last message, when the node gives up."""
        request = cluster_pb2.HealthCheckRequest(
            wait_timeout=duration_pb2.Duration(seconds=int(wait_timeout), nanos=int((wait_timeout % 1) * 1e9)),
            cluster_info=cluster_pb2.ClusterInfo(
                control_plane_nodes=list(control_plane_nodes),
                worker_nodes=list(worker_nodes),
                force_endpoint=force_endpoint,
            ),
        )
        seen: list[str] = []

        async def body(channel: Any, md: dict, t: float) -> list[str]:
            stub = cluster_grpc.ClusterServiceStub(channel)
            async with stub.HealthCheck.open(timeout=t, metadata=md) as stream:
                await stream.send_message(request, end=True)
                async for progress in stream:
                    if progress.metadata.error:
                        raise ClusterUnhealthyError(self.node, "health-check", progress.metadata.error)
                    seen.append(progress.message)
                    if on_progress is not None:
                        on_progress(progress.message)
            return seen

        try:
            return self._run("health-check", timeout or wait_timeout + self.deadlines.health_check_slack, body)
        except TalosError as exc:
            if not seen:
                raise
            problem = f"{exc.problem}; last progress: {seen[-1]}"
            raise type(exc)(exc.node, exc.operation, problem, status=exc.status) from exc


def discover(address: str, *, port: int = APID_PORT, deadlines: Deadlines | None = None) -> Discovery:
    """One-shot discovery of a maintenance-mode node."""
    return TalosClient.maintenance(address, port=port, deadlines=deadlines).discover()
