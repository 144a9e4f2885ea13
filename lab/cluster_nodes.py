"""What one emulated cluster's machines write into its real apiserver, as kubelets and Talos would.

Each pass reads the apiserver first and writes only what differs, so the ClusterRunner
(lab/clusters.py), which owns the processes, can run it every tick:
- a Node per member whose kubelet runs (lab/talos_node/kubelet.py), registered the way a kubelet
  registers itself (lab/kubelets.py) with the machine's boot id, reported NotReady with its pods
  terminated when a graceful reboot signals its kubelet (and none started on it until the next
  boot's kubelet starts: `kubelets.refuse_started`), left unrenewed while its machine is down
  (reboot, reset, crash, power-off; a Ready kwok still wrote then is taken back:
  `kubelets.take_back_late_ready`), played by kwok again once its kubelet started after the
  boot (the boot plus the machine's kubelet_delay), with the new boot id, every pod bound to it
  started (one kwok missed is touched so it looks again: lab/kubelet_resync.py);
- each machine's view of its Node's readiness (EmulatedNode.node_ready, for its MachineStatus);
- the control planes' static-pod mirror Pods (lab/static_pods.py);
- the CNI-ready mark kwok turns into Node readiness, set while the Cilium agent pod on it is Ready;
- the pod-network verdicts (lab/pod_network.py) and the real processes of Flux's pods;
- the Talos bootstrap manifests' missing objects (lab/bootstrap_manifests.py: created once).
"""

from __future__ import annotations

import logging
from typing import Callable

from kubernetes import client

from lab import bootstrap_manifests, kubelet_resync, kubelets, kwok, pod_network, static_pods
from lab.cluster_config import ClusterConfig, MemberInfo, v1alpha1
from lab.cluster_health import cni_ready_nodes
from lab.pod_processes import PodProcess
from lab.standins.loop import REQUEST_TIMEOUT, list_json
from lab.talos_node import manifests as talos_manifests
from lab.talos_node.cluster import ClusterRegistry
from lab.talos_node.node import EmulatedNode

log = logging.getLogger(__name__)


class NodeSync:
    """The Node objects of one cluster's machines, and the passes that follow them."""

    def __init__(self, registry: ClusterRegistry, key: str, name: str, wake: Callable[[], None] = lambda: None) -> None:
        self.registry = registry
        self.key = key
        self.name = name
        self.wake = wake  # runs the next pass now: a machine's kubelet signals a shutdown or a start
        self.registered: dict[str, str] = {}  # node address -> Node name
        self._ready_boot: dict[str, str] = {}  # node address -> the boot its Node was last seen Ready on, while its kubelet runs
        self._manifests_known: set = set()  # bootstrap-manifest objects seen (created once, never updated)
        self._left: dict[str, str] = {}  # Node name -> when the lab took its Lease (its machine is down)
        self.passes = 0  # passes completed: a test waits for one that began after what it changed

    def members(self) -> list[EmulatedNode]:
        """Nodes of this cluster whose kubelet runs: configured with its config, kubelet started."""
        return [n for n in self.registry.nodes_of(self.key)
                if n.mode == "configured" and n.config is not None and n.kubelet.running]

    def detach(self) -> None:
        """The runner stops: no kubelet of this cluster holds a machine's shutdown lock any more."""
        for node in self.registry.nodes_of(self.key):
            if node.kubelet.player is self.wake:
                node.kubelet.player = None

    def reconcile(self, api: client.ApiClient, config: ClusterConfig, processes: list[PodProcess],
                  objects_moved: bool = True) -> None:
        """One pass; those that follow the cluster's objects only when `objects_moved`."""
        core = client.CoreV1Api(api)
        nodes = {n.metadata.name: n for n in core.list_node(_request_timeout=REQUEST_TIMEOUT).items}
        cidrs = [n.spec.pod_cidr for n in nodes.values() if n.spec and n.spec.pod_cidr]
        machines = self.registry.nodes_of(self.key)
        for machine in machines:  # the kubelet subscribes to its machine's shutdown signal
            machine.kubelet.player = self.wake
        current = {n.address: (n, MemberInfo.of(n)) for n in self.members()}
        leases = client.CoordinationV1Api(api)
        written: dict[str, bool] = {}  # Node name -> the Ready this pass wrote
        for machine in machines:
            if machine.kubelet.shutting_down:
                self._shut_down(core, leases, machine, nodes, written)
        for address, (machine, member) in current.items():
            self._start(core, leases, config, machine, member, nodes.get(member.hostname), cidrs, written)
        for address in [a for a in self.registered if a not in current]:
            # The machine went down (reboot, reset, crash, power-off): its kubelet stopped; the
            # Node stays as it was, unrenewed (lab/kubelets.py).
            name = self.registered.pop(address)
            if name in nodes:
                self._left[name] = kubelets.api_time()
                kubelets.leave(leases, name)
                log.info("cluster %s: Node %s (%s) is down; no kubelet renews it now", self.name, name, address)
        for machine in machines:  # what each machine learns of its Node (its MachineStatus nodeReady)
            node = nodes.get(machine.hostname)
            ready = written.get(machine.hostname, _ready(node) if node is not None else None)
            if ready and _boot_id(node) == machine.boot_id and self._ready_boot.get(machine.address) != machine.boot_id:
                self._ready_boot[machine.address] = machine.boot_id  # once per boot: tests read the order
                machine.record("node-ready", hostname=machine.hostname)
            machine.node_ready = ready
        static_pods.reconcile(core, current.values(), nodes)
        if objects_moved:
            running = {member.hostname for _, member in current.values()}
            for name, node in nodes.items():
                if name not in running and (node.metadata.annotations or {}).get(kubelets.STOPPED_ANNOTATION) == "stopped":
                    if refused := kubelets.refuse_started(core, name):
                        log.info("cluster %s: Node %s's kubelet is stopped; %d pods started on it refused", self.name,
                                 name, refused)
            pods = list_json(core.list_pod_for_all_namespaces)
            since = {member.hostname: machine.kubelet.health_changed for machine, member in current.values()
                     if machine.kubelet.up}
            if taken := kubelets.take_back_late_ready(core, pods, self._left):
                log.info("cluster %s: pods kwok made Ready after their machine went down, taken back: %s", self.name,
                         ", ".join(taken))
            if touched := kubelet_resync.resync(core, pods, since):
                log.info("cluster %s: pods kwok had not started, touched so it looks again: %s", self.name,
                         ", ".join(touched))
            self._reconcile_cni(core, nodes, pods)
            pod_network.reconcile(core, nodes, pods, kube_proxy=config.kube_proxy)  # seed 002: host-network clients of the Service ClusterIP
            if processes and (taken or touched):  # pods this pass changed: the processes follow what they are now
                pods = list_json(core.list_pod_for_all_namespaces)
            for process in processes:
                process.reconcile(core, pods)
        # Talos's ManifestApplyController on a control plane: the bootstrap manifests' missing objects.
        cps = sorted((n for n, m in current.values() if m.control_plane), key=lambda n: n.address)
        if cps:
            manifests = talos_manifests.render(v1alpha1(cps[0].config.raw))
            bootstrap_manifests.create_missing(api, cps[0], manifests, self._manifests_known)
        self.passes += 1

    def _start(self, core: client.CoreV1Api, leases: client.CoordinationV1Api, config: ClusterConfig,
               machine: EmulatedNode, member: MemberInfo, existing, cidrs: list, written: dict) -> None:
        """A running kubelet: its Node registered, or reporting this boot when it is a new one."""
        address, name, boot_id = machine.address, member.hostname, machine.kubelet.boot_id or ""
        if existing is None:
            cidr = kubelets.pod_cidr(config.pod_subnet, cidrs)
            cidrs.append(cidr)
            allow = config.allow_scheduling_on_control_planes
            body = kubelets.node_manifest(member, cluster=self.name, cidr=cidr, allow_scheduling_on_control_planes=allow,
                                          boot_id=boot_id)
            try:
                core.create_node(body, _request_timeout=REQUEST_TIMEOUT)
                log.info("cluster %s: registered Node %s (%s)", self.name, name, address)
            except client.ApiException as e:
                if e.status != 409:
                    raise
        else:
            if (existing.metadata.annotations or {}).get(kwok.MANAGED_ANNOTATION) != self.name:
                self._annotate(core, name, {kwok.MANAGED_ANNOTATION: self.name})
            info = existing.status.node_info if existing.status else None
            fresh = (info.boot_id if info else "") != boot_id
            if (address not in self.registered or fresh) and kubelets.start(core, leases, name, boot_id, fresh=fresh):
                log.info("cluster %s: Node %s (%s) is back; kwok plays its kubelet again", self.name, name, address)
            if fresh:
                written[name] = False
        self.registered[address] = name
        self._left.pop(name, None)

    def _shut_down(self, core: client.CoreV1Api, leases: client.CoordinationV1Api, machine: EmulatedNode,
                   nodes: dict, written: dict) -> None:
        """A graceful reboot signalled the kubelet: it reports the shutdown, then lets go."""
        name = self.registered.pop(machine.address, None)
        try:
            if name is not None and name in nodes:
                if machine.kubelet.drain:  # Talos's CordonAndDrainNode, while the kubelet still runs
                    evicted = kubelets.drain(core, name)
                    log.info("cluster %s: Node %s cordoned and drained (%d pods evicted)", self.name, name, evicted)
                self._left[name] = kubelets.api_time()
                ended = kubelets.shut_down(core, leases, name)
                written[name] = False
                log.info("cluster %s: Node %s (%s) is shutting down; %d pods terminated", self.name, name,
                         machine.address, ended)
        finally:
            machine.kubelet.release_shutdown()

    def _reconcile_cni(self, core: client.CoreV1Api, nodes: dict, pods: list[dict]) -> None:
        ready = cni_ready_nodes(pods)
        for name in self.registered.values():
            node = nodes.get(name)
            if node is None:
                continue
            marked = (node.metadata.annotations or {}).get(kwok.CNI_READY_ANNOTATION) == "true"
            if (name in ready) != marked:
                self._annotate(core, name, {kwok.CNI_READY_ANNOTATION: "true" if name in ready else None})

    @staticmethod
    def _annotate(core: client.CoreV1Api, name: str, annotations: dict) -> None:
        core.patch_node(name, {"metadata": {"annotations": annotations}}, _request_timeout=REQUEST_TIMEOUT)


def _boot_id(node) -> str | None:
    info = node.status.node_info if node is not None and node.status else None
    return info.boot_id if info else None


def _ready(node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)
