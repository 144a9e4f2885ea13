"""What the emulator serves Talos's own CLI for its day-2 flows, pure parts: the event buffer's xids
and tail options, the events a machine publishes for a boot and a reboot, the COSI resources of
its cluster and secrets in the protobuf form Go clients decode, and its logs."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec
from lab.talos_node import cluster_resources, event_stream, events, logs
from lab.talos_node.cluster import ClusterRegistry
from lab.talos_node.machineconfig import parse
from protos.gen.definitions import resources_pb2 as defs
from protos.gen.machine import machine_pb2

CP, WORKER = "127.0.99.1", "127.0.99.2"


class FakeNode:
    """What events.py and cluster_resources.py read of an EmulatedNode."""

    def __init__(self, address: str, config, registry: ClusterRegistry, mode: str = "configured") -> None:
        self.address, self.config, self.registry, self.mode = address, config, registry, mode
        self.port, self.talos_version, self.boot_id = 50000, "v1.13.0", "boot-1"
        self.booted_at = Timestamp(seconds=int(time.time()) - 60)
        self.events: list[dict] = []

    hostname = property(lambda self: "talos-" + self.address.replace(".", "-"))
    cluster_key = property(lambda self: self.config.cluster_key if self.config else None)
    is_control_plane = property(lambda self: bool(self.config and self.config.is_control_plane))
    is_up = property(lambda self: self.mode in ("maintenance", "configured"))

    def event_log(self) -> list[dict]:
        return list(self.events)


@pytest.fixture(scope="module")
def cluster():
    bundle = secrets.generate()
    spec = ClusterSpec(name="day2", endpoint=f"https://{CP}:6443", kubernetes_version="1.35.4",
                       workers=(PoolSpec("web", 1),))
    registry: ClusterRegistry = ClusterRegistry()
    cp = FakeNode(CP, parse(mc.render(spec, bundle)), registry)
    worker = FakeNode(WORKER, parse(mc.render(spec, bundle, pool="web")), registry)
    for node in (cp, worker):
        registry.add_node(node)
    registry.bootstrap(cp.cluster_key, cp)
    return SimpleNamespace(bundle=bundle, cp=cp, worker=worker)


# --- the event buffer -----------------------------------------------------------------------


def test_xids_are_time_ordered_and_parse_back():
    first, second = event_stream.new_xid(1_800_000_000), event_stream.new_xid(1_800_000_000)
    assert len(first) == 20 and first < second
    assert int.from_bytes(event_stream.xid_bytes(first)[:4], "big") == 1_800_000_000
    with pytest.raises(ValueError):
        event_stream.xid_bytes("not-an-xid")


def test_tail_options_pick_where_a_watcher_starts():
    buffer = event_stream.EventBuffer()
    now = time.time()
    ids = [buffer.publish(machine_pb2.TaskEvent(task=f"t{i}"), at=now - 100 + i * 30).id for i in range(4)]
    start = lambda **kw: buffer.start(machine_pb2.EventsRequest(**kw))  # noqa: E731
    assert start() == 4  # live events only
    assert start(tail_events=-1) == 0 and start(tail_events=2) == 2 and start(tail_events=99) == 0
    assert start(tail_id=ids[1]) == 2  # the events after that one
    assert start(tail_seconds=45) == 2 and start(tail_seconds=25) == 3  # published within the last N s
    assert [e.payload.task for e in buffer.since(2)] == ["t2", "t3"]
    for i in range(event_stream.CAPACITY):
        buffer.publish(machine_pb2.TaskEvent(task="x"))
    assert start(tail_events=-1) == buffer.written - (event_stream.CAPACITY - event_stream.GAP)


def test_events_carry_talos_type_urls():
    event = event_stream.EventBuffer().publish(machine_pb2.MachineStatusEvent(stage=4), "actor-1").to_proto()
    assert event.data.type_url == "talos/runtime/machine.MachineStatusEvent" and event.actor_id == "actor-1"
    hello = event_stream.hello("")
    assert hello.data.type_url == "" and len(hello.id) == 20


# --- what a machine publishes -------------------------------------------------------------------


def payloads(stream: events.MachineEvents) -> list:
    return [e.payload for e in stream.buffer.since(0)]


@pytest.fixture
def running(monkeypatch):
    """The lab's MachineStatus and services (machine_status.py, services.py, tested on their own):
    running and ready, every service up."""
    monkeypatch.setattr(events, "machine_status", lambda node: ("running", True, []))
    monkeypatch.setattr(events, "services", lambda node: [(s, "Running", True) for s in ("apid", "etcd", "kubelet")])


def test_a_boot_replays_its_sequences_services_and_status_then_a_reboot_starts_the_reboot_sequence(cluster, running):
    node = cluster.cp
    node.events = [{"event": "reboot"}, {"event": "booted"}]  # the reboot that led to this boot is history
    stream = events.MachineEvents()
    stream.sync(node)
    seen = payloads(stream)
    sequences = [(p.sequence, p.action) for p in seen if isinstance(p, machine_pb2.SequenceEvent)]
    assert sequences == [("initialize", 1), ("initialize", 2), ("boot", 1), ("boot", 2)]
    assert {p.service for p in seen if isinstance(p, machine_pb2.ServiceStateEvent)} >= {"etcd", "kubelet", "apid"}
    statuses = [(p.stage, p.status.ready) for p in seen if isinstance(p, machine_pb2.MachineStatusEvent)]
    assert statuses == [(events.STAGES["booting"], False), (events.STAGES["running"], True)]

    stream.sync(node)
    assert len(payloads(stream)) == len(seen)  # nothing new happened
    node.events.append({"event": "reboot"})
    stream.sync(node)
    new = payloads(stream)[len(seen):]
    assert (new[0].sequence, new[0].action) == ("reboot", machine_pb2.SequenceEvent.START)
    assert (new[1].stage, new[1].status.ready) == (events.STAGES["rebooting"], True)
    assert "stopAllServices" in [p.task for p in new if isinstance(p, machine_pb2.TaskEvent)]

    node.boot_id = "boot-2"  # back up: a new, empty buffer with this boot's history only
    node.events.append({"event": "booted"})
    stream.sync(node)
    assert [type(p).__name__ for p in payloads(stream)][:1] == ["SequenceEvent"]
    assert not any(getattr(p, "sequence", "") == "reboot" for p in payloads(stream))
    node.boot_id = "boot-1"


def test_the_reboot_sequence_is_published_once_under_the_requests_actor(cluster, running):
    node = cluster.worker
    stream = events.MachineEvents()
    stream.sync(node)
    stream.reboot_started(node, "actor-7")
    node.events.append({"event": "reboot"})
    stream.sync(node)
    reboots = [e for e in stream.buffer.since(0) if getattr(e.payload, "sequence", "") == "reboot"]
    assert [e.actor_id for e in reboots] == ["actor-7"]
    node.events.clear()


def test_a_status_change_is_published_once(cluster, monkeypatch):
    now = ["booting", False, [{"name": "services", "reason": "kubelet not running"}]]
    monkeypatch.setattr(events, "machine_status", lambda node: tuple(now))
    monkeypatch.setattr(events, "services", lambda node: [])
    stream = events.MachineEvents()
    stream.sync(cluster.worker)
    now[:] = ["running", True, []]
    stream.sync(cluster.worker)
    stream.sync(cluster.worker)
    statuses = [(p.stage, p.status.ready, [c.name for c in p.status.unmet_conditions]) for p in payloads(stream)
                if isinstance(p, machine_pb2.MachineStatusEvent)]
    assert statuses[-2:] == [(events.STAGES["booting"], False, ["services"]), (events.STAGES["running"], True, [])]


# --- COSI resources ---------------------------------------------------------------------------------


def test_members_list_every_configured_machine_of_the_cluster(cluster):
    found = cluster_resources.specs(cluster.worker, cluster_resources.MEMBER)
    assert sorted(found) == [cluster.cp.hostname, cluster.worker.hostname]
    cp = defs.MemberSpec.FromString(found[cluster.cp.hostname][1])
    worker = defs.MemberSpec.FromString(found[cluster.worker.hostname][1])
    assert (cp.machine_type, cp.control_plane.api_server_port) == (defs.TYPE_CONTROL_PLANE, 6443)
    assert (worker.machine_type, worker.HasField("control_plane")) == (defs.TYPE_WORKER, False)
    assert cp.addresses[0].ip == bytes([127, 0, 99, 1]) and cp.operating_system == "Talos (v1.13.0)"
    assert found[cluster.cp.hostname][0]["machineType"] == "controlplane"


def test_nodename_and_static_pod_statuses(cluster):
    (spec, proto), = cluster_resources.specs(cluster.worker, cluster_resources.NODENAME).values()
    assert defs.NodenameSpec.FromString(proto).nodename == cluster.worker.hostname == spec["nodename"]
    statuses = cluster_resources.specs(cluster.cp, cluster_resources.STATIC_POD_STATUS)
    assert sorted(statuses) == [f"kube-system/{c}-{cluster.cp.hostname}" for c in cluster_resources.STATIC_PODS]
    status = defs.StaticPodStatusSpec.FromString(next(iter(statuses.values()))[1]).pod_status
    assert status["phase"] == "Running" and {"type": "Ready", "status": "True"}.items() <= dict(
        next(c for c in status["conditions"] if c["type"] == "Ready")).items()
    assert cluster_resources.specs(cluster.worker, cluster_resources.STATIC_POD_STATUS) == {}


def test_root_secrets_carry_the_configs_cas(cluster):
    os_cp = defs.OSRootSpec.FromString(cluster_resources.specs(cluster.cp, cluster_resources.OS_ROOT)["os"][1])
    assert os_cp.issuing_ca.crt == cluster.bundle.os.crt and os_cp.issuing_ca.key
    os_worker = defs.OSRootSpec.FromString(cluster_resources.specs(cluster.worker, cluster_resources.OS_ROOT)["os"][1])
    assert os_worker.issuing_ca.crt == cluster.bundle.os.crt and not os_worker.issuing_ca.key
    k8s = defs.KubernetesRootSpec.FromString(cluster_resources.specs(cluster.cp, cluster_resources.K8S_ROOT)["k8s"][1])
    assert k8s.issuing_ca.crt == cluster.cp.config.k8s_ca.crt and k8s.endpoint.full_path == f"https://{CP}:6443"
    assert cluster_resources.specs(cluster.worker, cluster_resources.K8S_ROOT) == {}


def test_sensitive_definitions_are_marked(cluster):
    from lab.talos_node import resources

    assert resources.DEFINITIONS[cluster_resources.OS_ROOT].sensitive
    assert not resources.DEFINITIONS[cluster_resources.MEMBER].sensitive
    assert {"k8s", "cluster", "secrets"} <= set(resources.NAMESPACES)


# --- logs -------------------------------------------------------------------------------------------


def test_service_logs_and_kernel_lines(cluster):
    assert logs.service_log(cluster.cp, "etcd") and logs.service_log(cluster.worker, "etcd") == []
    assert any(cluster.worker.hostname in line for line in logs.service_log(cluster.worker, "kubelet"))
    assert logs.service_log(cluster.worker, "no-such-service") == []
    line = logs.kernel_log(cluster.cp)[0]
    assert line.startswith("kern:  notice: [") and line.endswith("\n")


def test_component_configs_carry_the_image_and_the_static_pods_config_version(cluster):
    from lab.talos_node import k8s_resources
    from lab.talos_node.machineconfig import v1alpha1_document

    (spec, proto), = cluster_resources.specs(cluster.cp, cluster_resources.APISERVER_CONFIG).values()
    assert defs.APIServerConfigSpec.FromString(proto).image == spec["image"] == \
        k8s_resources.image(v1alpha1_document(cluster.cp.config.raw), "kube-apiserver")
    pod = k8s_resources.static_pod(v1alpha1_document(cluster.cp.config.raw), "kube-apiserver", address=CP)
    assert cluster_resources.version(cluster.cp, cluster_resources.APISERVER_CONFIG) == \
        pod["metadata"]["annotations"][k8s_resources.CONFIG_VERSION]
    assert cluster_resources.specs(cluster.worker, cluster_resources.SCHEDULER_CONFIG) == {}
