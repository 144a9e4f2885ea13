"""The services a configured emulated machine runs, as machined reports them: ServiceList, the
COSI Service resources (Services.v1alpha1.talos.dev, namespace runtime: one per service while it
is Running, Talos's v1alpha1 ServiceController) and MachineStatus's "services" check.

apid, containerd, cri, machined, udevd (and trustd on a control plane) simply run; the kubelet
has a life of its own (kubelet.py); etcd follows the node's standing in its cluster's etcd
(etcd_service.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp

from lab.talos_node import etcd_service
from lab.talos_node.kubelet import ServiceEvent
from protos.gen.machine import machine_pb2

if TYPE_CHECKING:
    from lab.talos_node.node import EmulatedNode

SERVICE_TYPE = "Services.v1alpha1.talos.dev"


@dataclass(frozen=True)
class Service:
    id: str
    state: str
    healthy: bool
    events: tuple[ServiceEvent, ...]
    health_message: str = ""
    health_changed: float = 0.0


def of(node: EmulatedNode) -> list[Service]:
    """The services of a configured node, sorted by id."""
    config = node.config
    assert config is not None
    booted = node.booted_at.ToSeconds()
    plain = ["apid", "containerd", "cri", "machined", "udevd"] + (["trustd"] if config.is_control_plane else [])
    out = [Service(s, "Running", True, (ServiceEvent("Running", "Service running", booted),), "", booted) for s in plain]
    out.append(_kubelet(node))
    if config.is_control_plane:  # Running but unhealthy: data of an etcd that lost its quorum
        state = node.registry.state(config.cluster_key)
        etcd = etcd_service.service(state.standing(node.address), bootstrapped=node.registry.has_quorum(config.cluster_key))
        out.append(Service("etcd", etcd.state, etcd.healthy, tuple(ServiceEvent(s, m, booted) for s, m in etcd.events),
                           "", booted))
    return sorted(out, key=lambda s: s.id)


def _kubelet(node: EmulatedNode) -> Service:
    kubelet, config = node.kubelet, node.config
    assert config is not None
    healthy = kubelet.up
    # A control plane's kubelet restarts its static pods on a new cluster CA chain: healthy again
    # once the lab's apiserver runs on the chain this node's config names.
    chain = node.registry.k8s_chain(config.cluster_key) if config.is_control_plane else None
    if chain is not None and chain != config.k8s_trusted:
        healthy = False
    return Service("kubelet", kubelet.state, healthy, tuple(kubelet.events), kubelet.health_message,
                   kubelet.health_changed)


def _ts(at: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(at * 1e9))
    return ts


def info(service: Service) -> machine_pb2.ServiceInfo:
    """ServiceList's entry for one service."""
    return machine_pb2.ServiceInfo(
        id=service.id,
        state=service.state,
        events=machine_pb2.ServiceEvents(events=[machine_pb2.ServiceEvent(msg=e.message, state=e.state, ts=_ts(e.at))
                                                 for e in service.events]),
        health=machine_pb2.ServiceHealth(healthy=service.healthy, last_message=service.health_message,
                                         last_change=_ts(service.health_changed or time.time())),
    )


def resources(services: list[Service]) -> dict[str, dict]:
    """The COSI Service resources: id → spec, for the services in the Running state only."""
    return {s.id: {"running": True, "healthy": s.healthy, "unknown": False} for s in services if s.state == "Running"}
