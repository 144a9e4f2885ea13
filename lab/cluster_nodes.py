"""What one emulated cluster's machines write into its real apiserver, as kubelets and Talos would.

Each pass reads the apiserver first and writes only what differs, so the ClusterRunner
(lab/clusters.py), which owns the processes, can run it every tick:
- a Node per member, registered the way a kubelet registers itself (lab/kubelets.py), played by
  kwok again when its machine comes back, left unrenewed when its machine leaves (reset) or
  loses power (a crash, a reset that powers it off);
- the control planes' static-pod mirror Pods (lab/static_pods.py);
- the CNI-ready mark kwok turns into Node readiness, set while the Cilium agent pod on it is Ready;
- the pod-network verdicts (lab/pod_network.py) and the real Flux Operator's process;
- the Talos bootstrap manifests' missing objects (lab/bootstrap_manifests.py: created once).
"""

from __future__ import annotations

import logging

from kubernetes import client

from lab import bootstrap_manifests, kubelets, kwok, pod_network, static_pods
from lab.cluster_config import ClusterConfig, MemberInfo, v1alpha1
from lab.cluster_health import CNI_NAMESPACE, CNI_SELECTOR, cni_ready_nodes
from lab.flux_operator import OperatorRunner
from lab.standins.loop import REQUEST_TIMEOUT
from lab.talos_node import manifests as talos_manifests
from lab.talos_node.cluster import ClusterRegistry
from lab.talos_node.node import EmulatedNode

log = logging.getLogger(__name__)
POWERED_OFF = ("off", "crashed")  # EmulatedNode modes of a machine whose kubelet cannot run


class NodeSync:
    """The Node objects of one cluster's machines, and the passes that follow them."""

    def __init__(self, registry: ClusterRegistry, key: str, name: str) -> None:
        self.registry = registry
        self.key = key
        self.name = name
        self.registered: dict[str, str] = {}  # node address -> Node name
        self._manifests_known: set = set()  # bootstrap-manifest objects seen (created once, never updated)

    def members(self) -> list[EmulatedNode]:
        """Nodes of this cluster whose kubelet would be up: configured with its config."""
        return [n for n in self.registry.nodes_of(self.key) if n.mode == "configured" and n.config is not None]

    def holding(self) -> list[EmulatedNode]:
        """Nodes whose kubelet will play again without a reset: configured with this cluster's
        config, rebooting ones included; not those without power (crashed, or powered off)."""
        return [n for n in self.registry.nodes_of(self.key) if n.mode not in POWERED_OFF]

    def reconcile(self, api: client.ApiClient, config: ClusterConfig, flux: OperatorRunner | None,
                  objects_moved: bool = True) -> None:
        """One pass; those that follow the cluster's objects only when `objects_moved`."""
        core = client.CoreV1Api(api)
        nodes = {n.metadata.name: n for n in core.list_node(_request_timeout=REQUEST_TIMEOUT).items}
        cidrs = [n.spec.pod_cidr for n in nodes.values() if n.spec and n.spec.pod_cidr]
        current = {n.address: (n, MemberInfo.of(n)) for n in self.members()}
        holding = {n.address for n in self.holding()}
        leases = client.CoordinationV1Api(api)
        for address, (_node, member) in current.items():
            existing = nodes.get(member.hostname)
            if existing is None:
                cidr = kubelets.pod_cidr(config.pod_subnet, cidrs)
                cidrs.append(cidr)
                allow = config.allow_scheduling_on_control_planes
                body = kubelets.node_manifest(member, cluster=self.name, cidr=cidr, allow_scheduling_on_control_planes=allow)
                try:
                    core.create_node(body, _request_timeout=REQUEST_TIMEOUT)
                    log.info("cluster %s: registered Node %s (%s)", self.name, member.hostname, address)
                except client.ApiException as e:
                    if e.status != 409:
                        raise
            elif (existing.metadata.annotations or {}).get(kwok.MANAGED_ANNOTATION) != self.name:
                self._annotate(core, member.hostname, {kwok.MANAGED_ANNOTATION: self.name})
            if address not in self.registered and existing is not None and kubelets.rejoin(core, leases, member.hostname):
                log.info("cluster %s: Node %s (%s) is back; kwok plays its kubelet again", self.name, member.hostname, address)
            self.registered[address] = member.hostname
        for address in [a for a in self.registered if a not in holding]:
            # The machine left (reset) or lost power: its kubelet stops; the Node stays, unrenewed (lab/kubelets.py).
            name = self.registered.pop(address)
            if name in nodes:
                kubelets.leave(leases, name)
                log.info("cluster %s: Node %s (%s) left; no kubelet renews it now", self.name, name, address)
        static_pods.reconcile(core, current.values(), nodes)
        if objects_moved:
            self._reconcile_cni(core, nodes)
            pod_network.reconcile(core, nodes, kube_proxy=config.kube_proxy)  # seed 002: host-network clients of the Service ClusterIP
            if flux is not None:
                flux.reconcile(core)
        # Talos's ManifestApplyController on a control plane: the bootstrap manifests' missing objects.
        cps = sorted((n for n, m in current.values() if m.control_plane), key=lambda n: n.address)
        if cps:
            manifests = talos_manifests.render(v1alpha1(cps[0].config.raw))
            bootstrap_manifests.create_missing(api, cps[0], manifests, self._manifests_known)

    def _reconcile_cni(self, core: client.CoreV1Api, nodes: dict) -> None:
        pods = core.list_namespaced_pod(CNI_NAMESPACE, label_selector=CNI_SELECTOR, _request_timeout=REQUEST_TIMEOUT).items
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
