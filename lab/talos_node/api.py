"""What an emulated node answers, method by method, once rpc.py has admitted the call.

Errors are raised as GRPCError with the codes and, where we know them, the texts Talos uses
(machined's v1alpha1 server and the maintenance service), so clients see what they would see
from a real node.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gzip
import io
import re
import tarfile
import time
import uuid
from typing import AsyncIterator

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from kontinuum.talos import pki
from lab.controlplane import kubeconfig_text
from lab.talos_node import apply_decision, etcd_api, machine_status, resources
from lab.talos_node import services as machine_services
from lab.talos_node.call import Call
from lab.talos_node.cluster import AlreadyBootstrapped, HealthQuery
from lab.talos_node.machineconfig import AppliedConfig, InvalidConfig, parse, v1alpha1_document
from lab.talos_node.manifests import render as render_manifests
from lab.talos_node.node import EmulatedNode
from protos.gen.cluster import cluster_pb2
from protos.gen.common import common_pb2
from protos.gen.machine import machine_pb2
from protos.gen.v1alpha1 import state_pb2

Mode = machine_pb2.ApplyConfigurationRequest
KUBECONFIG_CHUNK = 1024  # small, so clients must reassemble several chunks
HEALTH_POLL = 0.25  # seconds between health evaluations
DEFAULT_HEALTH_WAIT = 20 * 60.0  # talosctl's default wait_timeout
_INSTALLER_TAG = re.compile(r":(v\d+\.\d+\.\d+[^@/]*)(@sha256:[0-9a-f]+)?$")


def _mode_name(mode: int) -> str:
    return Mode.Mode.Name(mode).lower().replace("_", "-")


_MODES = {_mode_name(m): m for m in Mode.Mode.values()}
_APPLY_GUARD_SINCE = (1, 13, 3)  # Talos's ApplyConfiguration concurrency guard (commit 01b434870)


def _has_apply_guard(version: str) -> bool:
    found = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version)
    return found is not None and tuple(int(g) for g in found.groups()) >= _APPLY_GUARD_SINCE


class NodeApi:
    def __init__(self, node: EmulatedNode) -> None:
        self.node = node

    # --- helpers --------------------------------------------------------------------------

    def _config(self) -> AppliedConfig:
        assert self.node.config is not None  # rpc.py admits these only in configured mode
        return self.node.config

    def _control_plane_only(self, api: str) -> AppliedConfig:
        config = self._config()
        if not config.is_control_plane:
            raise GRPCError(Status.UNIMPLEMENTED, f"{api} is only available on control plane nodes")
        return config

    def _etcd_cluster(self, api: str) -> str:
        config = self._control_plane_only(api)
        if not self.node.registry.state(config.cluster_key).bootstrapped:
            raise GRPCError(Status.FAILED_PRECONDITION, "etcd is not running on this node: the cluster is not bootstrapped")
        return config.cluster_key

    @staticmethod
    def _parse(data: bytes) -> AppliedConfig:
        try:
            return parse(data)
        except InvalidConfig as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from None

    # --- MachineService -------------------------------------------------------------------

    async def apply_configuration(self, call: Call, request) -> machine_pb2.ApplyConfigurationResponse:
        """Talos's handler: parse and validate, decide live or reboot (apply_decision.py), answer
        a dry run, then apply. machine.ca/acceptedCAs and cluster.ca/acceptedCAs change live
        (talosctl rotate-ca's phases): apid reloads its certificates, the lab's control plane
        restarts its apiserver on the new chain (lab/clusters.py)."""
        node = self.node
        if node.mode == "maintenance":
            return self._apply_in_maintenance(call, request)
        if "os:admin" not in call.roles:  # authz lets os:reader through for maintenance mode only
            raise GRPCError(Status.PERMISSION_DENIED, "not authorized")
        if node.reboot_applied_at == node.boots and _has_apply_guard(node.talos_version):
            raise GRPCError(Status.FAILED_PRECONDITION, "configuration was already applied and node is rebooting, "
                                                        "cannot apply more configuration changes until next reboot")
        new = self._parse(request.data)
        old = self._config()
        try:
            resolved = apply_decision.resolve(_mode_name(request.mode), old.raw, new.raw)
        except apply_decision.RefusedLive as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, str(exc)) from None
        mode = _MODES[resolved.mode]
        if request.dry_run:
            return self._applied(mode, apply_decision.dry_run_details(resolved, old.raw, new.raw))
        node.record("apply", mode=resolved.mode, requested=_mode_name(request.mode), stage="configured")
        if mode == Mode.REBOOT:
            node.reboot_applied_at = node.boots
            call.after_reply.append(lambda: node.schedule_reboot(lambda: node.adopt(new)))
        elif mode == Mode.STAGED:
            node.staged = new
        else:
            node.config = new
            if (new.os_ca, new.trusted_cas) != (old.os_ca, old.trusted_cas):
                call.after_reply.append(node.schedule_tls_reload)
        return self._applied(mode, resolved.details)

    def _apply_in_maintenance(self, call: Call, request) -> machine_pb2.ApplyConfigurationResponse:
        if request.mode in (Mode.NO_REBOOT, Mode.STAGED):
            raise GRPCError(
                Status.UNIMPLEMENTED,
                f"apply configuration --mode='{_mode_name(request.mode)}' is not supported in maintenance mode",
            )
        new = self._parse(request.data)
        if request.dry_run:
            return self._applied(Mode.REBOOT, "Dry run summary:\nNode is running in maintenance mode and does not have a config yet.")
        self.node.record("apply", mode="reboot", requested=_mode_name(request.mode), stage="maintenance")
        call.after_reply.append(lambda: self.node.schedule_reboot(lambda: self.node.adopt(new)))
        return self._applied(Mode.REBOOT, "Applied configuration with a reboot")

    @staticmethod
    def _applied(mode: int, details: str) -> machine_pb2.ApplyConfigurationResponse:
        return machine_pb2.ApplyConfigurationResponse(
            messages=[machine_pb2.ApplyConfiguration(mode=mode, mode_details=details)]
        )

    async def bootstrap(self, call: Call, request) -> machine_pb2.BootstrapResponse:
        config = self._config()
        if not config.is_control_plane:
            raise GRPCError(Status.FAILED_PRECONDITION, "bootstrap can only be performed on a control plane node")
        recover = etcd_api.recovery_snapshot(self.node, request)
        try:
            self.node.registry.bootstrap(config.cluster_key, self.node, recover_from=recover,
                                         skip_hash_check=request.recover_skip_hash_check)
        except AlreadyBootstrapped:
            raise GRPCError(Status.ALREADY_EXISTS, "etcd data directory is not empty") from None
        self.node.etcd_snapshot = None  # Talos deletes the uploaded file once etcd restored it
        return machine_pb2.BootstrapResponse(messages=[machine_pb2.Bootstrap()])

    async def etcd_snapshot(self, call: Call, request) -> AsyncIterator[common_pb2.Data]:
        async for chunk in etcd_api.snapshot(self.node, self._etcd_cluster("etcd snapshot")):
            yield chunk

    async def etcd_recover(self, call: Call, request) -> machine_pb2.EtcdRecoverResponse:
        self._control_plane_only("etcd recover")
        return etcd_api.recover(self.node, request)

    async def etcd_member_list(self, call: Call, request) -> machine_pb2.EtcdMemberListResponse:
        key = self._etcd_cluster("etcd member list")
        members = sorted(self.node.registry.state(key).members.values(), key=lambda m: m.hostname)
        return machine_pb2.EtcdMemberListResponse(
            messages=[
                machine_pb2.EtcdMembers(
                    members=[
                        machine_pb2.EtcdMember(
                            id=m.id, hostname=m.hostname, peer_urls=m.peer_urls, client_urls=m.client_urls
                        )
                        for m in members
                    ]
                )
            ]
        )

    async def etcd_remove_member_by_id(self, call: Call, request) -> machine_pb2.EtcdRemoveMemberByIDResponse:
        key = self._etcd_cluster("etcd remove member")
        if not self.node.registry.remove_member(key, request.member_id):
            raise GRPCError(Status.NOT_FOUND, "etcdserver: member not found")
        return machine_pb2.EtcdRemoveMemberByIDResponse(messages=[machine_pb2.EtcdRemoveMemberByID()])

    async def etcd_leave_cluster(self, call: Call, request) -> machine_pb2.EtcdLeaveClusterResponse:
        key = self._etcd_cluster("etcd leave cluster")
        if not self.node.registry.leave(key, self.node.address):
            raise GRPCError(Status.FAILED_PRECONDITION, "this node is not an etcd member")
        return machine_pb2.EtcdLeaveClusterResponse(messages=[machine_pb2.EtcdLeaveCluster()])

    async def kubeconfig(self, call: Call, request) -> AsyncIterator[common_pb2.Data]:
        config = self._control_plane_only("kubeconfig")
        if not self.node.registry.state(config.cluster_key).bootstrapped:
            raise GRPCError(Status.FAILED_PRECONDITION, "kubeconfig is not available before the cluster is bootstrapped")
        assert config.k8s_ca is not None  # machineconfig.parse requires it on control planes
        admin = pki.issue_cert(
            config.k8s_ca,
            common_name="admin",
            organizations=["system:masters"],
            client=True,
            key_type="ecdsa",
            now=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=10),
        )
        text = kubeconfig_text(config.cluster_name, config.endpoint, config.k8s_ca.crt, admin).encode()
        archive = io.BytesIO()
        with gzip.GzipFile(fileobj=archive, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            info = tarfile.TarInfo("kubeconfig")
            info.size, info.mode, info.mtime = len(text), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(text))
        data = archive.getvalue()
        for offset in range(0, len(data), KUBECONFIG_CHUNK):
            yield common_pb2.Data(bytes=data[offset : offset + KUBECONFIG_CHUNK])

    async def reset(self, call: Call, request) -> machine_pb2.ResetResponse:
        node, config = self.node, self._config()
        if request.user_disks_to_wipe:
            if request.mode == machine_pb2.ResetRequest.SYSTEM_DISK:
                raise GRPCError(
                    Status.UNKNOWN,
                    "reset failed: invalid input, wipe mode SYSTEM_DISK doesn't support UserDisksToWipe parameter",
                )
            disk = request.user_disks_to_wipe[0]
            why = "is the system disk" if disk == "/dev/sda" else "wasn't found"
            raise GRPCError(Status.UNKNOWN, f"reset user disk failed: device {disk} {why}")
        if request.system_partitions_to_wipe and request.mode == machine_pb2.ResetRequest.USER_DISKS:
            raise GRPCError(
                Status.UNKNOWN,
                "reset failed: invalid input, wipe mode USER_DISKS doesn't support SystemPartitionsToWipe parameter",
            )
        partitions = {p.label for p in request.system_partitions_to_wipe if p.wipe}
        wipes_disk = request.mode != machine_pb2.ResetRequest.USER_DISKS and not partitions
        wipes_config = wipes_disk or "STATE" in partitions
        # A wiped system disk has nothing to boot: the machine is back only if it boots from the network.
        power_off = not request.reboot or (wipes_disk and not node.faults.netboot)
        if request.graceful and config.is_control_plane:
            node.registry.leave(config.cluster_key, node.address)

        def forget() -> None:
            if wipes_disk or "EPHEMERAL" in partitions:  # its member stays behind (graceful=False)
                node.registry.drop_data(config.cluster_key, node.address)
            node.config = node.staged = None
            node.registry.forget_if_empty(config.cluster_key)

        def wipe_etcd() -> None:  # EPHEMERAL holds /var/lib/etcd and an uploaded snapshot
            node.etcd_snapshot = None
            node.registry.wipe_etcd(config.cluster_key, node.address)

        transition = forget if wipes_config else wipe_etcd if "EPHEMERAL" in partitions else None
        # A graceful reset cordons and drains the node first (Talos's Reset sequence).
        call.after_reply.append(lambda: node.schedule_reboot(transition, power_off=power_off, drain=request.graceful))
        return machine_pb2.ResetResponse(messages=[machine_pb2.Reset(actor_id=str(uuid.uuid4()))])

    async def service_list(self, call: Call, request) -> machine_pb2.ServiceListResponse:
        self._config()
        listed = [machine_services.info(s) for s in machine_services.of(self.node)]
        return machine_pb2.ServiceListResponse(messages=[machine_pb2.ServiceList(services=listed)])

    async def upgrade(self, call: Call, request) -> machine_pb2.UpgradeResponse:
        match = _INSTALLER_TAG.search(request.image)
        if not match:
            raise GRPCError(
                Status.UNKNOWN,
                f'error validating installer image "{request.image}": the image has no Talos version tag',
            )
        node, version = self.node, match.group(1)
        if request.stage:
            node.staged_version = version
        else:
            call.after_reply.append(lambda: node.schedule_reboot(lambda: setattr(node, "talos_version", version),
                                                                 drain=True))  # the Upgrade sequence drains first
        return machine_pb2.UpgradeResponse(
            messages=[machine_pb2.Upgrade(ack="Upgrade request received", actor_id=str(uuid.uuid4()))]
        )

    async def version(self, call: Call, request) -> machine_pb2.VersionResponse:
        return machine_pb2.VersionResponse(
            messages=[
                machine_pb2.Version(
                    version=machine_pb2.VersionInfo(
                        tag=self.node.talos_version,
                        sha="kontinuum-emulator",
                        built="",
                        go_version="go1.26.1",
                        os="linux",
                        arch="amd64",
                    ),
                    platform=machine_pb2.PlatformInfo(name="metal", mode="metal"),
                    features=machine_pb2.FeaturesInfo(rbac=True),
                )
            ]
        )

    # --- ClusterService -------------------------------------------------------------------

    async def health_check(self, call: Call, request) -> AsyncIterator[cluster_pb2.HealthCheckProgress]:
        """Stream "waiting for <check>: <problem>" until every check passes, like talosctl's
        server-side health; past wait_timeout the call ends with DeadlineExceeded."""
        key = self._config().cluster_key
        info = request.cluster_info
        cps, workers = tuple(info.control_plane_nodes), tuple(info.worker_nodes)
        if not cps and not workers:
            nodes = self.node.registry.nodes_of(key)
            cps = tuple(sorted(n.address for n in nodes if n.is_control_plane))
            workers = tuple(sorted(n.address for n in nodes if not n.is_control_plane))
        query = HealthQuery(key, cps, workers, info.force_endpoint)
        wait = request.wait_timeout.ToTimedelta().total_seconds() if request.HasField("wait_timeout") else 0
        deadline = asyncio.get_running_loop().time() + (wait or DEFAULT_HEALTH_WAIT)

        def progress(text: str) -> cluster_pb2.HealthCheckProgress:
            return cluster_pb2.HealthCheckProgress(message=text)

        yield progress(f"discovered nodes: control plane: {list(cps)}, worker: {list(workers)}")
        reported: dict[str, str | None] = {}
        while True:
            checks = await asyncio.to_thread(self.node.registry.health, query)
            failing = None
            for name, problem in checks:
                if problem is None:
                    if reported.get(name, "") is not None:
                        reported[name] = None
                        yield progress(f"waiting for {name}: OK")
                    continue
                failing = (name, problem)
                if reported.get(name) != problem:
                    reported[name] = problem
                    yield progress(f"waiting for {name}: {problem}")
                break
            if failing is None:
                return
            if asyncio.get_running_loop().time() >= deadline:
                raise GRPCError(Status.DEADLINE_EXCEEDED, f"{failing[0]}: {failing[1]}")
            await asyncio.sleep(HEALTH_POLL)

    # --- cosi.resource.State --------------------------------------------------------------

    def _resources(self, namespace: str, rtype: str) -> dict[str, tuple[dict, bytes]]:
        node = self.node
        definition = resources.DEFINITIONS.get(rtype)
        if definition is None or (rtype == resources.bootstrap.TYPE and node.mode == "maintenance"):
            if node.mode == "maintenance":
                raise GRPCError(Status.PERMISSION_DENIED, f"resource type {rtype!r} is not supported")
            raise GRPCError(Status.NOT_FOUND, f"resource type {rtype!r} is not registered")
        if namespace not in resources.NAMESPACES:
            raise GRPCError(Status.PERMISSION_DENIED, f"namespace {namespace!r} is not supported")
        configured_cp = node.mode != "maintenance" and node.config is not None and node.is_control_plane
        stage, ready, unmet = machine_status.status(node)
        facts = resources.NodeFacts(
            address=node.address,
            talos_version=node.talos_version,
            stage=stage,
            ready=ready,
            unmet=unmet,
            services=self._running_services(),
            manifests=render_manifests(v1alpha1_document(node.config.raw)) if configured_cp and rtype == resources.bootstrap.TYPE else {},
            config=node.config.raw if node.mode != "maintenance" and node.config is not None else b"",
        )
        return resources.specs(facts).get((namespace, rtype), {})

    def _running_services(self) -> dict[str, dict]:
        node = self.node
        if node.mode == "maintenance" or node.config is None:
            return {}
        return machine_services.resources(machine_services.of(node))

    async def cosi_get(self, call: Call, request) -> state_pb2.GetResponse:
        found = self._resources(request.namespace, request.type).get(request.id)
        if found is None:
            raise GRPCError(
                Status.NOT_FOUND, f"resource {request.type}({request.namespace}/{request.id}@undefined) doesn't exist"
            )
        spec, proto = found
        return state_pb2.GetResponse(
            resource=resources.resource(request.namespace, request.type, request.id, spec, proto, self.node.booted_at)
        )

    async def cosi_list(self, call: Call, request) -> AsyncIterator[state_pb2.ListResponse]:
        items = self._resources(request.namespace, request.type)
        pattern = re.compile(request.options.id_query.regexp) if request.options.id_query.regexp else None
        for rid in sorted(items):
            if pattern is not None and not pattern.search(rid):
                continue
            if any(t.op != t.NOT_EXISTS for q in request.options.label_query for t in q.terms):
                continue  # our resources carry no labels, so only NOT_EXISTS terms can match
            spec, proto = items[rid]
            yield state_pb2.ListResponse(
                resource=resources.resource(request.namespace, request.type, rid, spec, proto, self.node.booted_at)
            )
