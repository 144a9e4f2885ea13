"""The lab's kubelets, as the cluster sees them: each member's Node, registered when its machine
joins, left unrenewed when the machine goes away (reset, power-off), played again when it rejoins.
kwok plays the kubelet of every Node carrying kwok.MANAGED_ANNOTATION whose Lease it holds.

kwok does not notice a Node losing its annotation; it stops playing a Node only when someone else
holds the Node's Lease. So when a machine leaves, the lab takes the Lease (LEFT_HOLDER, never
expiring, its renewTime unchanged): nobody renews it and the node lifecycle controller marks the
Node Unknown and its pods not Ready a grace period later, as for a real machine whose kubelet
stopped; the Node object stays as it was. When the machine rejoins, the lab lets the Lease go and
kwok takes it within its renew interval, as a fresh kubelet would, playing the Node and its pods
again.
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import TYPE_CHECKING, Iterable

from kubernetes import client

from lab import kwok
from lab.standins.loop import REQUEST_TIMEOUT

if TYPE_CHECKING:
    from lab.cluster_config import MemberInfo

CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
HOSTNAME_LABEL = "kubernetes.io/hostname"
LEASE_NAMESPACE = "kube-node-lease"
LEFT_HOLDER = "lab.kontinuum.sh/machine-left"  # holds a left machine's Lease so kwok cannot
LEFT_DURATION = 10 * 365 * 24 * 3600


def pod_cidr(pod_subnet: str, taken: Iterable[str]) -> str:
    """The first /24 of the pod subnet (or the subnet itself, if smaller) not taken yet."""
    net = ipaddress.ip_network(pod_subnet, strict=False)
    prefix = 24 if net.version == 4 else 64
    if net.prefixlen >= prefix:
        return str(net)
    used = set(taken)
    for sub in net.subnets(new_prefix=prefix):
        if str(sub) not in used:
            return str(sub)
    raise RuntimeError(f"pod subnet {pod_subnet} has no free /{prefix} left")


def node_manifest(member: MemberInfo, *, cluster: str, cidr: str, allow_scheduling_on_control_planes: bool) -> dict:
    """The Node a kubelet registers on a Talos machine (status included: Nodes take it on create)."""
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        HOSTNAME_LABEL: member.hostname,
        **member.node_labels,
    }
    taints = []
    if member.control_plane:
        labels[CONTROL_PLANE_LABEL] = ""
        if not allow_scheduling_on_control_planes:
            taints.append({"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"})
    resources = {"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": member.hostname,
            "labels": labels,
            "annotations": {
                kwok.MANAGED_ANNOTATION: cluster,
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], **({"taints": taints} if taints else {})},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": member.address},
                {"type": "Hostname", "address": member.hostname},
            ],
            "capacity": resources,
            "allocatable": resources,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": f"Talos ({member.talos_version})",
                "kernelVersion": "6.12.0-talos",
                "kubeletVersion": member.kubelet_version,
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "containerd://2.1.0 (lab: kwok)",
                "machineID": hashlib.sha256(member.address.encode()).hexdigest()[:32],
                "systemUUID": "",
                "bootID": "",
            },
        },
    }



def leave(leases: client.CoordinationV1Api, name: str) -> None:
    """The machine behind Node `name` went away: no kubelet renews its Lease from now on."""
    try:
        leases.patch_namespaced_lease(name, LEASE_NAMESPACE, {"spec": {
            "holderIdentity": LEFT_HOLDER, "leaseDurationSeconds": LEFT_DURATION}}, _request_timeout=REQUEST_TIMEOUT)
    except client.ApiException as e:
        if e.status != 404:  # no Lease (never played, or deleted with its Node): nothing renews it
            raise
    # The Node itself stays as it was (Ready until the controller says Unknown): were it changed
    # now, kwok might still act on it before it sees the Lease go, and the controller marks pods
    # not Ready only on a Ready → not-Ready transition.


def rejoin(core: client.CoreV1Api, leases: client.CoordinationV1Api, name: str) -> bool:
    """Let the Lease of a Node whose machine is back go, so kwok takes it; True if it was held."""
    try:
        lease = leases.read_namespaced_lease(name, LEASE_NAMESPACE, _request_timeout=REQUEST_TIMEOUT)
    except client.ApiException as e:
        if e.status != 404:
            raise
        return False
    if lease.spec.holder_identity != LEFT_HOLDER:
        return False
    # Its Cilium agent went with the machine: the fresh kubelet reports the network not ready.
    core.patch_node(name, {"metadata": {"annotations": {kwok.CNI_READY_ANNOTATION: None}}},
                    _request_timeout=REQUEST_TIMEOUT)
    leases.patch_namespaced_lease(name, LEASE_NAMESPACE, {"spec": {
        "holderIdentity": None, "leaseDurationSeconds": kwok.LEASE_SECONDS}}, _request_timeout=REQUEST_TIMEOUT)
    return True
