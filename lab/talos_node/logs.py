"""MachineService.Logs and Dmesg of an emulated machine: a few plausible lines, in the shapes
Talos serves them (common.Data chunks of raw text).

Logs: a system service's log (namespace "system", or the kubelet in any namespace) from machined's
in-memory buffer: lines written since this boot by the services the machine runs; an unknown
service has an empty log (Talos creates its buffer on first use). Containers of other namespaces
are not emulated: "container <id> not found". `tail_lines` keeps the last N (negative: all);
`follow` keeps the stream open until the client leaves or the machine goes down.
Dmesg: kernel lines as "<facility>: <priority, width 7>: [<RFC 3339 time>]: <message>".
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import AsyncIterator

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from lab.talos_node.call import Call
from lab.talos_node.node import EmulatedNode
from protos.gen.common import common_pb2

FOLLOW_POLL = 0.2


def _stamp(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def service_log(node: EmulatedNode, service: str) -> list[str]:
    """The lines a service wrote this boot (none for a service this machine does not run)."""
    config, at = node.config, node.booted_at.ToNanoseconds() / 1e9
    control_plane = bool(config and config.is_control_plane)
    ts = _stamp(at)
    lines = {
        "machined": [f"[talos] {ts} service[apid](Running): Started task apid", f"[talos] {ts} boot sequence: done"],
        "apid": [f"{ts} apid: starting apid (Talos {node.talos_version})", f"{ts} apid: listening on {node.address}:{node.port}"],
        "containerd": [f'time="{ts}" level=info msg="containerd successfully booted"'],
        "cri": [f'time="{ts}" level=info msg="Start cri plugin"'],
        "udevd": [f"{ts} udevd: starting version 257"],
        "kubelet": [f'{{"ts":{at:.3f},"caller":"app/server.go:1262","msg":"Started kubelet","v":0}}',
                    f'{{"ts":{at + 1:.3f},"caller":"kubelet/kubelet_node_status.go:75","msg":"Successfully registered node",'
                    f'"node":"{node.hostname}"}}'],
    }
    if control_plane:
        lines["trustd"] = [f"{ts} trustd: listening on {node.address}:50001"]
        lines["etcd"] = [f'{{"level":"info","ts":"{ts}","caller":"etcdmain/etcd.go:64","msg":"Running: ","args":["etcd"]}}',
                         f'{{"level":"info","ts":"{ts}","caller":"embed/serve.go:210","msg":"serving client traffic securely",'
                         f'"address":"{node.address}:2379"}}']
    return lines.get(service, []) if node.mode == "configured" else []


def kernel_log(node: EmulatedNode) -> list[str]:
    at = node.booted_at.ToNanoseconds() / 1e9
    entries = [("kern", "notice", 0.0, "Linux version 6.18.1-talos (@buildkitsandbox) #1 SMP"),
               ("kern", "info", 0.1, "Command line: talos.platform=metal console=ttyS0"),
               ("kern", "info", 0.5, "virtio_net virtio1 eth0: renamed from eth0"),
               ("user", "warning", 2.0, f"[talos] node {node.hostname}: boot sequence done")]
    return [f"{fac}: {prio:>7}: [{_stamp(at + off)}]: {msg}\n" for fac, prio, off, msg in entries]


class LogsApi:
    def __init__(self, node: EmulatedNode) -> None:
        self.node = node

    async def logs(self, call: Call, request) -> AsyncIterator[common_pb2.Data]:
        if request.namespace != "system" and request.id != "kubelet":
            raise GRPCError(Status.UNKNOWN, f'container "{request.id}" not found')
        lines = service_log(self.node, request.id)
        if request.tail_lines >= 0:
            lines = lines[len(lines) - min(request.tail_lines, len(lines)):]
        if lines:
            yield common_pb2.Data(bytes="".join(line + "\n" for line in lines).encode())
        await self._follow(request.follow)

    async def dmesg(self, call: Call, request) -> AsyncIterator[common_pb2.Data]:
        for line in kernel_log(self.node):
            yield common_pb2.Data(bytes=line.encode())
        await self._follow(request.follow)

    async def _follow(self, follow: bool) -> None:
        """With follow, stay open (no new lines come) while this boot lasts."""
        boot = self.node.boot_id
        while follow and self.node.boot_id == boot and self.node.is_up:
            await asyncio.sleep(FOLLOW_POLL)
