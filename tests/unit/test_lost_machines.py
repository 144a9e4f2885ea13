"""Machines declared lost (kontinuum/lifecycle/lost_machines.py, providers/lost_machines.py and the
stack config): which members are removed, when it is refused, what is reset, and that a lost
machine is never called. Fake Talos nodes record every call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from grpclib.const import Status

from kontinuum.lifecycle.lost_machines import LostMachine, LostMachineError, quorum_problem, take_out
from kontinuum.stackconfig.parse import parse
from kontinuum.talos.answers import EtcdMember, ServiceStatus
from kontinuum.talos.errors import TalosApiError, TalosTimeoutError, TlsTrustError
from providers.lost_machines import check_lost, diff_lost

CPS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def member(i: int, address: str) -> EtcdMember:
    return EtcdMember(id=0x1000 + i, hostname=f"cp-{i}", peer_urls=(f"https://{address}:2380",),
                      client_urls=(f"https://{address}:2379",), is_learner=False)


class Fleet:
    """Talos nodes: `dead` time out, `maintenance` answer as an unconfigured machine, the rest
    answer with the cluster's config. Every call is recorded per node."""

    def __init__(self, members: list[str], dead=(), maintenance=(), unhealthy=()):
        self.members = [member(i, a) for i, a in enumerate(members)]
        self.dead, self.maintenance, self.unhealthy = set(dead), set(maintenance), set(unhealthy)
        self.calls: list[tuple[str, str]] = []

    def client_for(self, address: str):
        fleet = self

        def call(name, result=None):
            def run(*args, **kwargs):
                fleet.calls.append((address, name))
                if address in fleet.dead:
                    raise TalosTimeoutError(address, name, "deadline exceeded")
                if address in fleet.maintenance:
                    raise TlsTrustError(address, name, "certificate not trusted")
                return result(*args, **kwargs) if callable(result) else result
            return run

        def remove(member_id, **_):
            if not any(m.id == member_id for m in fleet.members):
                raise TalosApiError(address, "etcd-remove-member", "not found", status=Status.NOT_FOUND)
            fleet.members = [m for m in fleet.members if m.id != member_id]

        healthy = address not in self.unhealthy
        return SimpleNamespace(
            deadlines=SimpleNamespace(etcd=10.0, service_list=10.0, reset=10.0),
            version=call("Version", "v1.13.0"),
            etcd_members=call("EtcdMemberList", lambda **_: list(fleet.members)),
            etcd_remove_member=call("EtcdRemoveMemberByID", remove),
            service_list=call("ServiceList", [ServiceStatus("etcd", "Running", healthy)]),
            reset=call("Reset"),
        )

    def on(self, address: str) -> list[str]:
        return [name for a, name in self.calls if a == address]


def lost(address: str, role: str = "controlplane") -> LostMachine:
    return LostMachine(f"i-{address}", address, role, f"zones[0].talosAddresses[{address[-1]}]")


def run(fleet: Fleet, machines: list[LostMachine], handled=(), cps=None):
    said = []
    fleet.nodes_removed = []
    fleet.recorded = []
    out = take_out(machines, set(handled), client_for=fleet.client_for, remove_nodes=fleet.nodes_removed.extend,
                   after_reset=fleet.recorded.append,
                   control_planes=cps or [a for a in CPS if a not in {m.address for m in machines}],
                   zone="eu-a", log=said.append) if all(m.role == "controlplane" for m in machines) else None
    return out, said


def test_one_lost_control_plane_is_removed_through_a_survivor_and_never_called():
    fleet = Fleet(CPS, dead=[CPS[2]])
    out, said = run(fleet, [lost(CPS[2])], cps=CPS[:2])
    assert [m.hostname for m in fleet.members] == ["cp-0", "cp-1"]
    assert fleet.on(CPS[2]) == ["Version"]  # the one probe that shows it does not answer
    assert "EtcdRemoveMemberByID" in fleet.on(CPS[0]) and "removed etcd member 0000000000001002" in said[0]
    assert out == {"handled": [f"i-{CPS[2]}"], "reset": []} and fleet.nodes_removed == [lost(CPS[2])]


def test_a_resumed_run_removes_nothing_twice():
    fleet = Fleet(CPS[:2], dead=[CPS[2]])  # the member went in a run that was killed afterwards
    out, said = run(fleet, [lost(CPS[2])], cps=CPS[:2])
    assert "EtcdRemoveMemberByID" not in fleet.on(CPS[0]) and not said
    assert out["handled"] == [f"i-{CPS[2]}"] and fleet.nodes_removed == [lost(CPS[2])]  # deleting is idempotent


def test_two_of_three_lost_is_refused_naming_them_and_the_restore():
    fleet = Fleet(CPS, dead=CPS[1:])
    with pytest.raises(LostMachineError) as e:
        run(fleet, [lost(CPS[1]), lost(CPS[2])], cps=CPS[:1])
    assert "cp-1 (10.0.0.2), cp-2 (10.0.0.3)" in str(e.value) and "kontinuum restore" in str(e.value)
    assert len(fleet.members) == 3 and not any(n == "EtcdRemoveMemberByID" for _, n in fleet.calls)


def test_quorum_counts_only_healthy_survivors():
    members = [member(i, a) for i, a in enumerate(CPS)]
    assert quorum_problem(members, {CPS[2]}, {CPS[0], CPS[1]}) is None
    problem = quorum_problem(members, {CPS[2]}, {CPS[0]})
    assert "10.0.0.2 not healthy" in problem and "majority of 2" in problem
    assert quorum_problem(members[:1], {CPS[0]}, set()) is not None  # the last member


def test_a_machine_marked_lost_that_answers_is_refused_before_anything_changes():
    fleet = Fleet(CPS)
    with pytest.raises(LostMachineError) as e:
        run(fleet, [lost(CPS[2])], cps=CPS[:2])
    assert "zones[0].talosAddresses[3] (10.0.0.3)" in str(e.value) and "Remove `lost: true`" in str(e.value)
    assert len(fleet.members) == 3 and fleet.on(CPS[0]) == []


def test_a_lost_machine_back_with_its_old_config_is_reset_once_it_answers():
    fleet = Fleet(CPS[:2])  # taken out earlier; now it answers again
    out, said = run(fleet, [lost(CPS[2])], handled=[f"i-{CPS[2]}"], cps=CPS[:2])
    assert fleet.on(CPS[2]) == ["Version", "Reset"] and out["reset"] == [CPS[2]]
    assert fleet.recorded == [lost(CPS[2])]  # waited for in maintenance mode, its new certificate recorded
    assert fleet.nodes_removed == [lost(CPS[2])]  # the Node its kubelet registered again
    assert "answers again" in said[-1]
    back_in_maintenance = Fleet(CPS[:2], maintenance=[CPS[2]])
    out, _ = run(back_in_maintenance, [lost(CPS[2])], handled=[f"i-{CPS[2]}"], cps=CPS[:2])
    assert back_in_maintenance.on(CPS[2]) == ["Version"] and out["reset"] == []
    assert back_in_maintenance.nodes_removed == []  # done when it was taken out


def test_provider_check_and_diff():
    entry = {"name": "i", "address": "10.0.0.9", "role": "worker", "path": "zones[0].talosAddresses[4]"}
    creds = {"talosconfig": "x", "hubKubeconfig": "y"}
    assert check_lost({"lost": [entry], **creds}) == []
    assert check_lost({"lost": [{**entry, "role": "spare"}], **creds})[0].reason.startswith("entry 0")
    assert check_lost({"lost": [entry]})[0].property == "talosconfig"
    assert diff_lost({"lost": [], "controlPlanes": CPS}, {"lost": [], "controlPlanes": CPS}).changes is False
    # while a machine is declared lost, every up runs it: only a run sees it come back
    assert diff_lost({"lost": [entry], "controlPlanes": CPS}, {"lost": [entry], "controlPlanes": CPS}).changes is True


def zone_config(machines: list, replicas: int = 1) -> dict:
    return {"region": "eu", "hubKubeconfigFile": "hub.yaml",
            "hub": {"dnsDomain": "example.com", "grpcEndpoint": "hub.example.com:443",
                    "acme": {"email": "ops@example.com", "server": "https://acme.example.com/dir"},
                    "auth": {"mode": "anonymous"}},
            "zones": [{"zone": "a", "talosAddresses": machines,
                       "controlPlane": {"replicas": replicas, **({"endpoint": "https://10.0.0.100:6443"}
                                                                 if replicas > 1 else {})}}]}


def test_a_lost_machine_is_no_member_and_the_next_spare_replaces_it():
    from kontinuum_components.talos_cluster import pool_members

    raw = zone_config(["10.0.0.1", {"address": "10.0.0.2", "lost": True}, "10.0.0.3", "10.0.0.4"], replicas=3)
    zone = parse(raw).zones[0]
    assert [m.addresses[0] for m in pool_members(zone, zone.control_plane)] == ["10.0.0.1", "10.0.0.3", "10.0.0.4"]


def test_config_errors_for_lost_machines():
    with pytest.raises(Exception) as e:
        parse(zone_config([{"address": "10.0.0.1", "lost": True}]))
    assert "every control-plane machine is marked lost" in str(e.value)
    with pytest.raises(Exception) as e:
        parse(zone_config(["10.0.0.1", "10.0.0.2", {"address": "10.0.0.3", "lost": True}], replicas=3))
    assert "3 wanted but zones[0].talosAddresses lists 2 machines for pool 'controlplane' that are not marked lost" \
        in str(e.value)


def test_a_machine_that_does_not_answer_names_the_way_to_declare_it_lost():
    from kontinuum.talos.errors import NodeUnreachableError

    for error in (NodeUnreachableError("10.0.0.3", "apply-config", "connection refused"),
                  TalosTimeoutError("10.0.0.3", "apply-config", "deadline exceeded")):
        assert "10.0.0.3" in str(error) and "`lost: true`" in str(error)
