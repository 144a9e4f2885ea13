"""The emulator's crash model, pure parts: the etcd standing of a node whose member was removed
while it kept its data, what its etcd service and the health check then say, what apid says of a
crashed node it cannot reach, and which machines' kubelets play their Node."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from lab import cluster_nodes
from lab.talos_node import dial, etcd_service
from lab.talos_node.cluster import ClusterRegistry, HealthQuery

KEY = "cluster-a"


@dataclass
class FakeNode:
    """What the registry reads of a node (cluster.ClusterNode)."""

    address: str
    mode: str = "configured"
    port: int = 50000
    cluster_key: str | None = KEY
    is_control_plane: bool = True
    config: object = object()
    kubelet: object = None

    @property
    def hostname(self) -> str:
        return "cp-" + self.address.rsplit(".", 1)[1]

    @property
    def is_up(self) -> bool:
        return self.mode in ("maintenance", "configured")


def three_control_planes() -> tuple[ClusterRegistry, list[FakeNode]]:
    registry: ClusterRegistry = ClusterRegistry()
    nodes = [FakeNode(f"127.0.99.{i}") for i in (1, 2, 3)]
    for n in nodes:
        registry.add_node(n)
    registry.bootstrap(KEY, nodes[0])
    return registry, nodes


def member_id(registry: ClusterRegistry, address: str) -> int:
    (found,) = [i for i, m in registry.state(KEY).members.items() if m.address == address]
    return found


def etcd_check(registry: ClusterRegistry, nodes: list[FakeNode]) -> str | None:
    query = HealthQuery(KEY, tuple(n.address for n in nodes), ())
    return dict(registry.health(query))["etcd to be healthy"]


def test_a_member_removed_while_its_node_kept_its_data_cannot_come_back_until_a_wipe():
    registry, (cp1, cp2, cp3) = three_control_planes()
    assert registry.etcd_standing(KEY, cp3.address) == etcd_service.MEMBER
    old = member_id(registry, cp3.address)
    registry.join(KEY, cp3)  # a reboot on its own data: the same member
    assert member_id(registry, cp3.address) == old

    assert registry.remove_member(KEY, old)
    assert registry.etcd_standing(KEY, cp3.address) == etcd_service.REMOVED
    registry.join(KEY, cp3)  # boots again on the same data: etcd exits, nothing is re-added
    assert cp3.address not in {m.address for m in registry.state(KEY).members.values()}
    assert registry.etcd_standing(KEY, cp3.address) == etcd_service.REMOVED

    registry.wipe_etcd(KEY, cp3.address)  # reset --system-labels-to-wipe=EPHEMERAL
    assert registry.etcd_standing(KEY, cp3.address) == etcd_service.NONE
    assert registry.state(KEY).bootstrapped  # two of three members left: quorum holds
    registry.join(KEY, cp3)
    assert registry.etcd_standing(KEY, cp3.address) == etcd_service.MEMBER
    assert member_id(registry, cp3.address) != old


def test_a_member_removed_after_its_node_was_wiped_is_no_trouble_and_a_fresh_join_replaces_a_stale_one():
    registry, (cp1, cp2, cp3) = three_control_planes()
    stale = member_id(registry, cp3.address)
    registry.drop_data(KEY, cp3.address)  # reset wiping STATE and EPHEMERAL, graceful=False: member left behind
    registry.join(KEY, cp3)  # configured again: Talos's addMember removes the same-name member first
    fresh = member_id(registry, cp3.address)
    assert fresh != stale and len(registry.state(KEY).members) == 3

    registry.leave(KEY, cp2.address)  # EtcdLeaveCluster deletes the data too
    assert registry.etcd_standing(KEY, cp2.address) == etcd_service.NONE
    assert not registry.remove_member(KEY, stale)


def test_etcd_service_of_a_removed_member_waits_to_restart_with_etcds_last_words():
    running = etcd_service.service(etcd_service.MEMBER, bootstrapped=True)
    assert (running.state, running.healthy) == ("Running", True)
    assert not etcd_service.service(etcd_service.MEMBER, bootstrapped=False).healthy
    assert etcd_service.service(etcd_service.NONE, bootstrapped=True).state == "Preparing"

    failing = etcd_service.service(etcd_service.REMOVED, bootstrapped=True)
    assert (failing.state, failing.healthy) == ("Waiting", False)
    state, message = failing.last
    assert state == "Waiting" and message.startswith("Error running Containerd(etcd), going to restart forever: ")
    assert 'task "etcd" failed: exit code 1' in message
    assert "the member has been permanently removed from the cluster" in message

    assert etcd_service.health_problem(etcd_service.MEMBER, bootstrapped=True) is None
    assert etcd_service.health_problem(etcd_service.NONE, bootstrapped=True) is None  # the membership check's
    problem = etcd_service.health_problem(etcd_service.REMOVED, bootstrapped=True)
    assert problem.startswith('service "etcd" not in expected state "Running": current state [Waiting] ')


def test_health_check_names_a_crashed_control_plane_unreachable_and_a_removed_one_failing():
    registry, nodes = three_control_planes()
    cp1, cp2, cp3 = nodes
    assert etcd_check(registry, nodes) is None

    cp3.mode = "crashed"
    problem = etcd_check(registry, nodes)
    assert problem == f"{cp3.address}: " + dial.rpc_error(dial.timed_out(cp3.address, 50000))
    assert "i/o timeout" in problem and "refused" not in problem
    cp3.mode = "rebooting"  # up, but not listening: refused
    assert "connect: connection refused" in etcd_check(registry, nodes)

    cp3.mode = "configured"
    registry.remove_member(KEY, member_id(registry, cp3.address))
    problem = etcd_check(registry, nodes)
    assert problem.startswith(f"{cp3.address}: service \"etcd\" not in expected state") and "permanently removed" in problem
    checks = dict(registry.health(HealthQuery(KEY, tuple(n.address for n in nodes), ())))
    assert cp3.address in checks["etcd members to be control plane nodes"]


def test_dial_errors_read_as_grpc_go_writes_them():
    assert dial.timed_out("127.0.0.9", 50000) == (
        'connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.9:50000: i/o timeout"')
    assert dial.refused("127.0.0.9", 50000).endswith('dial tcp 127.0.0.9:50000: connect: connection refused"')
    assert dial.rpc_error("x") == "rpc error: code = Unavailable desc = x"


def test_only_machines_whose_kubelet_runs_play_their_node():
    """Not while rebooting (its kubelet stopped for it), crashed or off, nor after a boot until the
    kubelet started (kubelet_delay)."""
    registry: ClusterRegistry = ClusterRegistry()
    modes = [("configured", True), ("configured", False), ("rebooting", False), ("crashed", False), ("off", False)]
    for i, (mode, running) in enumerate(modes, 1):
        registry.add_node(FakeNode(f"127.0.99.{i}", mode=mode, kubelet=SimpleNamespace(running=running)))
    sync = cluster_nodes.NodeSync(registry, KEY, "zone-a")
    assert [n.address for n in sync.members()] == ["127.0.99.1"]


def test_etcd_loses_its_quorum_when_a_majority_of_member_machines_is_down():
    registry, (cp1, cp2, cp3) = three_control_planes()
    for n in (cp2, cp3):
        registry.join(KEY, n)
    assert registry.has_quorum(KEY)
    cp3.mode = "crashed"
    assert registry.has_quorum(KEY)  # two of three answer
    cp2.mode = "crashed"
    assert not registry.has_quorum(KEY)  # the survivor's etcd has no leader: unhealthy
    cp2.mode = "configured"
    assert registry.has_quorum(KEY)


def test_a_wipe_beside_crashed_members_loses_etcd_and_the_wiped_node_waits():
    registry, (cp1, cp2, cp3) = three_control_planes()
    for n in (cp2, cp3):
        registry.join(KEY, n)
    cp2.mode = cp3.mode = "crashed"
    cp1.mode = "rebooting"
    registry.wipe_etcd(KEY, cp1.address)  # the restore's wipe of the survivor
    assert not registry.state(KEY).bootstrapped
    cp1.mode = "booting"
    registry.join(KEY, cp1)  # nothing to join: its etcd waits for a (recovery) bootstrap
    assert registry.etcd_standing(KEY, cp1.address) == etcd_service.NONE
