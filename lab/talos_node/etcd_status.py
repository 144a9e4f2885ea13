"""MachineService.EtcdStatus and EtcdAlarmList of an emulated control plane: what Talos asks its
local etcd member (v1alpha1_server.go), from the lab's registry of the cluster's etcd.

Only a control plane of a bootstrapped cluster answers (Talos: "etcd status is only available on
control plane nodes"); a machine whose etcd is not a running member cannot reach its local etcd.
The member's status is plausible, not measured: the leader is the longest-standing member (the
bootstrap node unless it left), the term counts the cluster's bootstraps and the members that
joined, the raft index grows with time. There are never alarms.
"""

from __future__ import annotations

import time

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from lab.talos_node import etcd_service
from lab.talos_node.api import NodeApi
from lab.talos_node.call import Call
from lab.talos_node.node import EmulatedNode
from protos.gen.machine import machine_pb2

ETCD_VERSION = "3.6.9"  # what Talos v1.13.0 runs (constants.DefaultEtcdVersion)
DB_SIZE = 20 * 1024 * 1024


class EtcdStatusApi:
    def __init__(self, node: EmulatedNode) -> None:
        self.node = node

    def _member_id(self, api: str) -> tuple[int, list[int]]:
        """(this node's member ID, every member ID in joining order)."""
        key = NodeApi(self.node)._etcd_cluster(api)
        state = self.node.registry.state(key)
        mine = [i for i, m in state.members.items() if m.address == self.node.address]
        if state.standing(self.node.address) != etcd_service.MEMBER or not mine:
            raise GRPCError(Status.UNKNOWN, "failed to create etcd client: context deadline exceeded")
        if not self.node.registry.has_quorum(key):
            raise GRPCError(Status.UNKNOWN, f"failed to query {api.split()[-1]}: etcdserver: no leader")
        return mine[0], list(state.members)

    async def etcd_status(self, call: Call, request) -> machine_pb2.EtcdStatusResponse:
        member, members = self._member_id("etcd status")
        index = int(time.time() - self.node.booted_at.ToSeconds()) * 10 + 1000
        size = DB_SIZE + 4096 * len(members)
        status = machine_pb2.EtcdMemberStatus(
            member_id=member, protocol_version=ETCD_VERSION, storage_version=ETCD_VERSION.rsplit(".", 1)[0] + ".0",
            db_size=size, db_size_in_use=size * 3 // 5, leader=members[0], raft_index=index,
            raft_term=1 + len(members), raft_applied_index=index)
        return machine_pb2.EtcdStatusResponse(messages=[machine_pb2.EtcdStatus(member_status=status)])

    async def etcd_alarm_list(self, call: Call, request) -> machine_pb2.EtcdAlarmListResponse:
        self._member_id("etcd alarm list")
        return machine_pb2.EtcdAlarmListResponse(messages=[machine_pb2.EtcdAlarm()])
