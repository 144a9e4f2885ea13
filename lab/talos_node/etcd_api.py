"""EtcdSnapshot, EtcdRecover and Bootstrap(recover_etcd) on an emulated control plane, backed
by the cluster's REAL etcd: the snapshot is etcd's own (the lab's control plane registers a
reader with the registry), and a recovery hands the uploaded bytes to the registry, from which
the lab restores its etcd with etcdutl before starting the apiserver on it (lab/clusters.py).

Without a running etcd behind the cluster (an emulator with no lab control plane) a snapshot
is refused: there is nothing real to take it from.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from lab.talos_node.node import EmulatedNode
from protos.gen.common import common_pb2
from protos.gen.machine import machine_pb2

CHUNK = 64 * 1024
SNAPSHOT_TIMEOUT = 120.0  # seconds to read the lab etcd's snapshot


async def snapshot(node: EmulatedNode, cluster_key: str) -> AsyncIterator[common_pb2.Data]:
    if not any(m.address == node.address for m in node.registry.state(cluster_key).members.values()):
        raise GRPCError(Status.FAILED_PRECONDITION, "etcd is not running on this node")
    reader = node.registry.etcd(cluster_key)
    if reader is None:
        raise GRPCError(Status.UNAVAILABLE, "etcd snapshot: the etcd client is not available (no running etcd)")
    try:
        data = await asyncio.wait_for(asyncio.to_thread(reader), SNAPSHOT_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - what etcd said is the error
        raise GRPCError(Status.UNKNOWN, f"failed reading etcd snapshot: {exc}") from None
    for offset in range(0, len(data), CHUNK):
        yield common_pb2.Data(bytes=data[offset : offset + CHUNK])


def recover(node: EmulatedNode, chunks: list[common_pb2.Data]) -> machine_pb2.EtcdRecoverResponse:
    """Keep the upload as the node's /var/lib/etcd.snapshot (replacing an earlier one)."""
    node.etcd_snapshot = b"".join(c.bytes for c in chunks)
    return machine_pb2.EtcdRecoverResponse(messages=[machine_pb2.EtcdRecover()])


def recovery_snapshot(node: EmulatedNode, request: machine_pb2.BootstrapRequest) -> bytes | None:
    """The snapshot a Bootstrap(recover_etcd) restores from; refused when none was uploaded."""
    if not request.recover_etcd:
        return None
    if node.etcd_snapshot is None:
        raise GRPCError(Status.FAILED_PRECONDITION,
                        "recover_etcd: no snapshot at /var/lib/etcd.snapshot (upload one with EtcdRecover first)")
    return node.etcd_snapshot
