"""Which apiservers an emulated cluster runs (lab/cluster_apiservers.py), against a fake control
plane: one per control plane that is up and an etcd member, stopped (killed when the power went)
while its machine is down, restarted after a reboot even between two ticks, and what the serving
certificates name (lab/apiservers.py), as Talos's KubernetesCertSANsController does."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab import cluster_apiservers
from lab.apiservers import ServingNames
from lab.cluster_apiservers import ClusterApiservers
from lab.talos_node import etcd_service


@dataclass
class Kubelet:
    running: bool = True


@dataclass
class Node:
    address: str
    mode: str = "configured"
    kubelet: Kubelet = field(default_factory=Kubelet)
    is_control_plane: bool = True
    boot_id: str = "boot-1"
    config: object = "config"

    @property
    def hostname(self) -> str:
        return "talos-" + self.address.replace(".", "-")


@dataclass
class Registry:
    nodes: list[Node]
    standing: dict[str, str] = field(default_factory=dict)

    def nodes_of(self, key):
        return list(self.nodes)

    def node(self, address):
        return next((n for n in self.nodes if n.address == address), None)

    def etcd_standing(self, key, address):
        return self.standing.get(address, etcd_service.MEMBER)


class Process:
    def __init__(self):
        self.alive, self.how = True, None

    def running(self):
        return self.alive

    def tail(self):
        return "last line"


@dataclass
class Server:
    address: str
    tag: object
    process: Process = field(default_factory=Process)
    ready: bool = False


class FakeControlPlane:
    def __init__(self):
        self.apiservers: dict[str, Server] = {}
        self.stopped: list[tuple[str, bool]] = []

    def start_apiserver(self, address, *, hostname=None, tag=None):
        self.apiservers[address] = Server(address, tag)

    def stop_apiserver(self, address, *, kill=False):
        self.apiservers.pop(address).process.alive = False
        self.stopped.append((address, kill))

    def apiserver_ready(self, address):
        self.apiservers[address].ready = True
        return True

    def serving(self):
        return [(a, 6443) for a, s in self.apiservers.items() if s.ready and s.process.alive]


class Config:
    endpoint, endpoint_host, endpoint_port = "https://lab.invalid:6443", "lab.invalid", 6443


CPS = ["127.0.64.1", "127.0.64.2", "127.0.64.3"]


def cluster(nodes: list[Node], **standing) -> tuple[ClusterApiservers, FakeControlPlane, Registry]:
    registry = Registry(nodes, dict(standing))
    apiservers = ClusterApiservers(registry, "key", "c", nodes[0], Config())
    cp = FakeControlPlane()
    cp.start_apiserver(nodes[0].address)
    apiservers.attach(cp, nodes[0].boot_id)
    return apiservers, cp, registry


def test_one_apiserver_per_control_plane_member_that_is_up():
    nodes = [Node(a) for a in CPS] + [Node("127.0.64.4", is_control_plane=False), Node("127.0.64.5", mode="booting")]
    apiservers, cp, _ = cluster(nodes, **{CPS[2]: etcd_service.REMOVED})
    apiservers.reconcile()
    assert sorted(cp.apiservers) == CPS[:2]  # not the worker, not one booting, not one whose member was removed
    assert sorted(cp.serving()) == [(a, 6443) for a in CPS[:2]]
    assert cp.stopped == []


def test_a_machine_that_goes_down_loses_its_apiserver_until_it_is_back():
    nodes = [Node(a) for a in CPS]
    apiservers, cp, _ = cluster(nodes)
    apiservers.reconcile()
    nodes[1].mode, nodes[2].mode = "rebooting", "crashed"
    apiservers.reconcile()
    assert list(cp.apiservers) == [CPS[0]]
    assert sorted(cp.stopped) == [(CPS[1], False), (CPS[2], True)]  # a reboot stops it, a crash kills it
    nodes[1].mode, nodes[1].boot_id, nodes[1].kubelet.running = "configured", "boot-2", False
    apiservers.reconcile()
    assert list(cp.apiservers) == [CPS[0]]  # its kubelet, which runs the static pod, has not started yet
    nodes[1].kubelet.running = True
    apiservers.reconcile()
    assert sorted(cp.apiservers) == CPS[:2] and cp.apiservers[CPS[1]].tag == "boot-2"


def test_a_reboot_between_two_ticks_restarts_the_apiserver():
    nodes = [Node(a) for a in CPS[:2]]
    apiservers, cp, _ = cluster(nodes)
    apiservers.reconcile()
    first = cp.apiservers[CPS[0]]
    nodes[0].boot_id = "boot-2"  # rebooted and configured again before this tick
    apiservers.reconcile()
    assert cp.stopped == [(CPS[0], False)] and cp.apiservers[CPS[0]] is not first


def test_a_reset_control_plane_loses_its_apiserver_and_a_joining_one_gets_one():
    nodes = [Node(a) for a in CPS[:2]]
    apiservers, cp, registry = cluster(nodes, **{CPS[2]: etcd_service.NONE})
    registry.nodes.append(Node(CPS[2]))
    apiservers.reconcile()
    assert sorted(cp.apiservers) == CPS[:2]
    registry.standing[CPS[2]] = etcd_service.MEMBER  # it joined etcd
    registry.nodes.remove(nodes[1])  # reset: it holds no config of the cluster now
    apiservers.reconcile()
    assert sorted(cp.apiservers) == [CPS[0], CPS[2]] and cp.stopped == [(CPS[1], True)]


def test_an_apiserver_that_exits_on_its_own_is_started_again_after_a_backoff(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(cluster_apiservers.time, "monotonic", lambda: now[0])
    apiservers, cp, _ = cluster([Node(a) for a in CPS[:2]])
    apiservers.reconcile()
    cp.apiservers[CPS[1]].process.alive = False
    apiservers.reconcile()
    assert CPS[1] not in cp.apiservers
    now[0] += cluster_apiservers.RESTART_BACKOFF
    apiservers.reconcile()
    assert cp.apiservers[CPS[1]].process.alive


def test_serving_names_follow_talos():
    names = ServingNames(("127.0.64.10", "api.lab.test", "127.0.64.10"), "cluster.local")
    ips, dns = names.split("127.0.64.2", "cp-2", "10.96.0.1")
    assert ips == ["127.0.64.10", "10.96.0.1", "127.0.64.2", "127.0.0.1"]
    assert dns == ["api.lab.test", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local", "localhost", "cp-2"]


def test_a_restarted_apiserver_is_doomed_only_by_its_own_failed_first_repair(tmp_path):
    """The line the real kube-apiserver v1.35.4 logged in the suite a minute before its post-start
    hook failed; another process's line (the log file is appended across restarts) or another
    error does not count."""
    from types import SimpleNamespace

    from lab.apiservers import repair_failed

    log = tmp_path / "kube-apiserver.log"
    server = SimpleNamespace(process=SimpleNamespace(popen=SimpleNamespace(pid=16296), log_path=log))
    assert not repair_failed(server)  # no log yet
    other = ('E1203 12:25:03.372666   16231 repair.go:85] "Unhandled Error" err="unable to refresh the port block: '
             'Get \\"https://127.0.50.2:47573/api/v1/services\\": tls: failed to verify certificate"\n')
    lease = ('E1203 12:27:28.015735   16296 controller.go:251] "Failed to update lease" err="Operation cannot be '
             'fulfilled on leases.coordination.k8s.io"\n')
    log.write_text(other + lease)
    assert not repair_failed(server)
    log.write_text(other + lease + other.replace("16231", "16296"))
    assert repair_failed(server)
