"""What the kubelet of an emulated Talos node shows of its machine config through the API:
static-pod mirror Pods on control planes and the kubelet version on every Node.

A Talos control plane runs kube-apiserver, kube-controller-manager and kube-scheduler as static
pods from the images in its machine config (cluster.apiServer.image, cluster.controllerManager.
image, cluster.scheduler.image), and its kubelet publishes a mirror Pod for each: kube-system,
`<component>-<node>`, labels k8s-app=<component> and tier=control-plane, status.hostIP the node's
address (how talosctl upgrade-k8s finds them), annotation `talos.dev/config-version` the version
of the component's config on that node (lab/talos_node/k8s_resources.py: a counter that goes up
whenever that component's rendered config changes, as Talos's config resource version does; the
node's COSI StaticPods carry the same). When it changes, Talos rewrites the static pod and the
kubelet replaces it: the mirror Pod is deleted and created again with the new spec, and kwok
walks it to Running and Ready (lab/kwok/stages.yaml). The Node reports the kubelet version of
machine.kubelet.image (status.nodeInfo.kubeletVersion) and the Talos version in osImage; a
changed config restarts the kubelet, which reports them again.

What the lab does NOT do: run another Kubernetes version. Each lab cluster's control plane is the
one pinned kube-apiserver, kube-controller-manager and kube-scheduler binary
(tools/versions.env KUBERNETES_VERSION), whatever version the machine config names; the images
and versions above are what a client sees of the config, `GET /version` is the binary's.

Each change is recorded in the node's event log ("static-pod", "kubelet"), so tests can prove
the order in which an upgrade reached the nodes.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Iterable

from kubernetes import client

from lab import kubelets
from lab.standins.loop import REQUEST_TIMEOUT
from lab.talos_node import k8s_resources
from lab.talos_node.machineconfig import v1alpha1_document

log = logging.getLogger(__name__)

NAMESPACE = "kube-system"
SELECTOR = "tier=control-plane"
MIRROR = kubelets.MIRROR_ANNOTATION
CONFIG_VERSION = k8s_resources.CONFIG_VERSION


def mirror_pod(component: str, image: str, *, node: str, node_uid: str, address: str, config_version: int = 1,
               command: list[str] | None = None) -> dict:
    """The mirror Pod the kubelet publishes for one static pod (spec as Talos renders it, cut down)."""
    digest = hashlib.sha256(f"{node}/{component}/{image}/{config_version}".encode()).hexdigest()[:16]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{component}-{node}",
            "namespace": NAMESPACE,
            "labels": {"k8s-app": component, "tier": "control-plane"},
            "annotations": {MIRROR: digest, "kubernetes.io/config.hash": digest, "kubernetes.io/config.source": "file",
                            CONFIG_VERSION: str(config_version), "lab.kontinuum.sh/node-address": address},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}],
        },
        "spec": {
            "nodeName": node,
            "hostNetwork": True,
            "priorityClassName": "system-cluster-critical",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "tolerations": [{"operator": "Exists", "effect": "NoExecute"}],
            "containers": [{"name": component, "image": image, "command": command or [f"/usr/local/bin/{component}"]}],
        },
    }


def reconcile(core: client.CoreV1Api, members: Iterable, nodes: dict) -> None:
    """Bring the mirror Pods and Node kubelet versions in line with each member's config.
    members: (EmulatedNode, MemberInfo) pairs of configured nodes; nodes: Node name → V1Node."""
    members = list(members)
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR,
                                                                 _request_timeout=REQUEST_TIMEOUT).items}
    for machine, member in members:
        node = nodes.get(member.hostname)
        if node is None:
            continue  # registered on this tick: next time
        _kubelet(core, machine, member, node)
        if not member.control_plane:
            continue
        # Image and config version from one read of the config: images read earlier in the pass
        # once met a config applied since then, pairing the old image with the new version (a
        # mirror Pod recreated on the old image, seen in the suite under load).
        doc = v1alpha1_document(machine.config.raw)
        for component in k8s_resources.STATIC_PODS:
            name = f"{component}-{member.hostname}"
            pod = pods.get(name)
            spec = k8s_resources.static_pod(doc, component, address=member.address)
            image = spec["spec"]["containers"][0]["image"]
            version = int(spec["metadata"]["annotations"][CONFIG_VERSION])
            if pod is not None and not pod.metadata.deletion_timestamp and pod.spec.containers[0].image == image \
                    and (pod.metadata.annotations or {}).get(CONFIG_VERSION) == str(version):
                continue
            if pod is not None:  # the kubelet replaces a changed static pod: mirror goes, comes back
                core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0, _request_timeout=REQUEST_TIMEOUT)
            body = mirror_pod(component, image, node=member.hostname, node_uid=node.metadata.uid, address=member.address,
                              config_version=version, command=spec["spec"]["containers"][0]["command"])
            try:
                core.create_namespaced_pod(NAMESPACE, body, _request_timeout=REQUEST_TIMEOUT)
            except client.ApiException as e:
                if e.status != 409:  # still going away: the next tick creates it
                    raise
                continue
            machine.record("static-pod", component=component, image=image, config_version=str(version))
            log.info("node %s: static pod %s runs %s", member.hostname, component, image)


def _kubelet(core: client.CoreV1Api, machine, member, node) -> None:
    info = node.status.node_info if node.status else None
    os_image = f"Talos ({member.talos_version})"
    if info is not None and info.kubelet_version == member.kubelet_version and info.os_image == os_image:
        return
    core.patch_node_status(member.hostname, {"status": {"nodeInfo": {"kubeletVersion": member.kubelet_version,
                                                                     "osImage": os_image}}},
                           _request_timeout=REQUEST_TIMEOUT)
    if info is None or info.kubelet_version != member.kubelet_version:
        machine.record("kubelet", version=member.kubelet_version)
        log.info("node %s: kubelet %s", member.hostname, member.kubelet_version)
