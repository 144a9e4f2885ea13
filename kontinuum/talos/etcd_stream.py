"""The two streamed etcd calls of the Talos API, each bounded by one deadline:

- EtcdSnapshot: the node streams etcd's own snapshot (the database plus etcd's 32-byte sha256
  trailer) in chunks; each chunk goes to `sink` as it arrives, nothing is held in memory;
- EtcdRecover: a client stream of chunks that the node keeps as /var/lib/etcd.snapshot for a
  following Bootstrap(recover_etcd).

They live beside client.py (which owns the unary calls) and reuse its transport and error
mapping.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from kontinuum.talos.answers import check_messages
from kontinuum.talos.client import TalosClient
from kontinuum.talos.errors import TalosApiError
from protos.gen.common import common_pb2
from protos.gen.machine import machine_grpc, machine_pb2

SNAPSHOT_TIMEOUT = 600.0  # seconds for a whole snapshot (large databases over slow links)
RECOVER_TIMEOUT = 600.0  # seconds for a whole upload


def snapshot(client: TalosClient, sink: Callable[[bytes], None], *, timeout: float = SNAPSHOT_TIMEOUT) -> int:
    """Stream the node's etcd snapshot into `sink`; returns the number of bytes received."""

    async def body(channel: Any, md: dict, t: float) -> int:
        total = 0
        stub = machine_grpc.MachineServiceStub(channel)
        async with stub.EtcdSnapshot.open(timeout=t, metadata=md) as stream:
            await stream.send_message(machine_pb2.EtcdSnapshotRequest(), end=True)
            async for chunk in stream:
                check_messages([chunk], client.node, "etcd-snapshot")
                if chunk.bytes:
                    sink(chunk.bytes)
                    total += len(chunk.bytes)
        return total

    return client._run("etcd-snapshot", timeout, body)


def recover(client: TalosClient, chunks: Iterable[bytes], *, timeout: float = RECOVER_TIMEOUT) -> int:
    """Upload a snapshot for Bootstrap(recover_etcd); returns the number of bytes sent."""

    async def body(channel: Any, md: dict, t: float) -> int:
        sent = 0
        stub = machine_grpc.MachineServiceStub(channel)
        async with stub.EtcdRecover.open(timeout=t, metadata=md) as stream:
            for chunk in chunks:
                await stream.send_message(common_pb2.Data(bytes=chunk))
                sent += len(chunk)
            await stream.end()
            reply = await stream.recv_message()
            if reply is None:
                raise TalosApiError(client.node, "etcd-recover", "the node ended the upload without a reply")
            check_messages(reply.messages, client.node, "etcd-recover")
        return sent

    return client._run("etcd-recover", timeout, body)
