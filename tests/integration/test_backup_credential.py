"""The zone's backup credential (os:etcd:backup, kontinuum/backup/credential.py) against an
emulated configured node over real gRPC: Talos's own role table (lab/talos_node/authz.py, taken
from Talos v1.13.0) lets it at etcd snapshots and etcd's status, members and alarms, and
refuses it everything else, also methods the lab does not serve. Addresses 127.0.66.16/29."""

from __future__ import annotations

import pytest
from google.protobuf import empty_pb2

from kontinuum.backup import credential
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec
from kontinuum.talos.errors import PermissionDeniedError, TalosError
from lab.talos_node import Lab
from grpclib.const import Cardinality

NODE = "127.0.66.17"


@pytest.fixture(scope="module")
def node():
    bundle = secrets.generate()
    spec = ClusterSpec(name="eu-a", endpoint=f"https://{NODE}:6443", kubernetes_version="1.35.4",
                       control_plane=PoolSpec(CONTROLPLANE, 1))
    with Lab(pool="127.0.66.16/29", reboot_delay=0.2) as lab:
        lab.add_node(NODE)
        TalosClient.maintenance(NODE).apply_config(mc.render(spec, bundle))
        lab.node(NODE).wait_for("configured", 10)
        text = credential.issue("eu-a", secrets.dump(bundle), [NODE])
        yield TalosClient.from_talosconfig(talosconfig.parse(text), node=NODE, endpoint=NODE)


def call(client: TalosClient, method: str) -> None:
    """/machine.MachineService/<method> with an empty request, whatever the generated stubs hold."""

    async def body(channel, md, t):
        async with channel.request(f"/machine.MachineService/{method}", Cardinality.UNARY_UNARY, empty_pb2.Empty,
                                   empty_pb2.Empty, timeout=t, metadata=md) as stream:
            await stream.send_message(empty_pb2.Empty(), end=True)
            await stream.recv_message()

    client._run(method, 10, body)


def test_the_backup_credential_is_refused_everything_but_etcd_snapshots_and_etcd_reads(node):
    refused = {
        "Version": lambda: node.version(timeout=10),
        "ServiceList": lambda: node.service_list(timeout=10),
        "Kubeconfig": lambda: node.kubeconfig(timeout=10),
        "Reset": lambda: node.reset(graceful=False, reboot=True, timeout=10),
        "Bootstrap": lambda: node.bootstrap(timeout=10),
        "EtcdLeaveCluster": lambda: node.etcd_leave(timeout=10),
        "machine config (COSI Get)": lambda: node.machine_config(timeout=10),
        # Served by Talos, not by the lab: refused by role before anything else, as machined does.
        "ServiceRestart": lambda: call(node, "ServiceRestart"),
        "Copy": lambda: call(node, "Copy"),
        "EtcdDefragment": lambda: call(node, "EtcdDefragment"),
    }
    for what, attempt in refused.items():
        with pytest.raises(PermissionDeniedError, match="not authorized"):
            attempt()
            pytest.fail(f"{what} was allowed with the backup credential")
    for method in ("EtcdStatus", "EtcdMemberList", "EtcdAlarmList", "EtcdSnapshot"):
        try:  # etcd is not bootstrapped here: any answer but "not authorized" shows the role is let through
            call(node, method)
        except PermissionDeniedError:
            pytest.fail(f"{method} is refused to os:etcd:backup, which Talos allows")
        except TalosError:
            pass
