"""The lab's kubelets, as the cluster sees them: each member's Node, registered when its machine's
kubelet first starts, reporting the shutdown of a graceful reboot, left unrenewed while the
machine is down (reboot, reset, crash, power-off), played again when its kubelet starts again.
kwok plays the kubelet of every Node carrying kwok.MANAGED_ANNOTATION whose Lease it holds.

kwok does not notice a Node losing its annotation; it stops playing a Node only when someone else
holds the Node's Lease. So when a machine leaves, the lab takes the Lease (LEFT_HOLDER, never
expiring, its renewTime unchanged): nobody renews it and the node lifecycle controller marks the
Node Unknown and its pods not Ready a grace period later, as for a real machine whose kubelet
stopped; the Node object stays as it was. When the machine rejoins, the lab lets the Lease go and
kwok takes it within its renew interval, as a fresh kubelet would, playing the Node and its pods
again.

A graceful reset and the Upgrade sequence first cordon and drain the node as Talos does (`drain`:
evictions of the pods a controller other than a DaemonSet owns). A graceful reboot then signals
the kubelet (lab/talos_node/kubelet.py). Talos configures its
kubelet with shutdownGracePeriod 30s (10s for critical pods) and answers its logind inhibitor
requests, so the kubelet's node shutdown manager (Kubernetes pkg/kubelet/nodeshutdown) reports the
Node NotReady, "node is shutting down" (ShutdownStatus, one of the Ready condition's errors), and
terminates every pod on it (phase Failed, reason Terminated, a DisruptionTarget condition), then
lets Talos stop it (`shut_down`). The Node carries STOPPED_ANNOTATION from then until its kubelet
starts again, so kwok's stages leave its status alone even before kwok sees its Lease go; a pod
kwok still started on it in that moment ends rejected, as the kubelet's admission leaves it
(`refuse_started`). The kubelet of the next boot reports the new boot id and, until the node's
Cilium agent is Ready again, the network not ready (`start`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import logging
import time
from typing import TYPE_CHECKING, Iterable

from kubernetes import client

from lab import api_json, kwok
from lab.standins.loop import REQUEST_TIMEOUT

if TYPE_CHECKING:
    from lab.cluster_config import MemberInfo

CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
HOSTNAME_LABEL = "kubernetes.io/hostname"
LEASE_NAMESPACE = "kube-node-lease"
LEFT_HOLDER = "lab.kontinuum.sh/machine-left"  # holds a left machine's Lease so kwok cannot
LEFT_DURATION = 10 * 365 * 24 * 3600
DRAIN_TIMEOUT = 30.0  # seconds the lab's drain takes at most (Talos allows 5 min)
log = logging.getLogger(__name__)
STOPPED_ANNOTATION = "lab.kontinuum.sh/kubelet"  # "stopped" while the machine's kubelet does not run
SHUTTING_DOWN = "node is shutting down"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
# How the kubelet rejects a pod it is asked to admit while its shutdown manager runs (Kubernetes
# v1.35.4 pkg/kubelet/nodeshutdown: NodeShutdownNotAdmittedReason; kubelet.go rejectPod).
REJECTED_REASON = "NodeShutdown"
REJECTED_MESSAGE = "Pod was rejected: Pod was rejected as the node is shutting down."
NETWORK_NOT_READY = ("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                     "message:Network plugin returns error: cni plugin not initialized")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


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


def node_manifest(member: MemberInfo, *, cluster: str, cidr: str, allow_scheduling_on_control_planes: bool,
                  boot_id: str = "") -> dict:
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
                "bootID": boot_id,
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


def start(core: client.CoreV1Api, leases: client.CoordinationV1Api, name: str, boot_id: str, *,
          fresh: bool) -> bool:
    """The machine's kubelet started: a `fresh` one (a new boot) reports the boot id and, its
    Cilium agent gone with the old boot, the network not ready; the Lease is let go so kwok takes
    it. True if the lab held the Lease (the machine was away)."""
    if fresh:
        now = api_time()
        core.patch_node(name, {"metadata": {"annotations": {kwok.CNI_READY_ANNOTATION: None, STOPPED_ANNOTATION: None}}},
                        _request_timeout=REQUEST_TIMEOUT)
        core.patch_node_status(name, {"status": {"nodeInfo": {"bootID": boot_id}, "conditions": [{
            "type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": NETWORK_NOT_READY,
            "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, _request_timeout=REQUEST_TIMEOUT)
    try:
        lease = leases.read_namespaced_lease(name, LEASE_NAMESPACE, _request_timeout=REQUEST_TIMEOUT)
    except client.ApiException as e:
        if e.status != 404:
            raise
        return False
    if lease.spec.holder_identity != LEFT_HOLDER:
        return False
    leases.patch_namespaced_lease(name, LEASE_NAMESPACE, {"spec": {
        "holderIdentity": None, "leaseDurationSeconds": kwok.LEASE_SECONDS}}, _request_timeout=REQUEST_TIMEOUT)
    return True


def shut_down(core: client.CoreV1Api, leases: client.CoordinationV1Api, name: str) -> int:
    """The kubelet's node shutdown manager on a graceful reboot: the Node NotReady ("node is
    shutting down"), every pod on it terminated; then the kubelet stops. Returns the pods ended."""
    leave(leases, name)
    core.patch_node(name, {"metadata": {"annotations": {STOPPED_ANNOTATION: "stopped"}}}, _request_timeout=REQUEST_TIMEOUT)
    now = api_time()
    core.patch_node_status(name, {"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": SHUTTING_DOWN,
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, _request_timeout=REQUEST_TIMEOUT)
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}", _request_timeout=REQUEST_TIMEOUT).items
    ended = 0
    for pod in pods:
        annotations = pod.metadata.annotations or {}
        if pod.metadata.deletion_timestamp or MIRROR_ANNOTATION in annotations or pod.status.phase in ("Succeeded", "Failed"):
            continue  # static pods' mirrors follow lab/static_pods.py
        try:
            core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, terminated(pod, now),
                                             _request_timeout=REQUEST_TIMEOUT)
            ended += 1
        except client.ApiException as e:
            if e.status != 404:
                raise
    return ended


def refuse_started(core: client.CoreV1Api, name: str) -> int:
    """Pods kwok started on Node `name` after its kubelet shut down. kwok learns from a watch that
    the lab holds the Node's Lease, so a pod bound in that moment (the DaemonSet's replacement of
    the agent just terminated) may still be started by it. A shutting-down kubelet admits no pod
    and a stopped one starts none: such a pod ends as its admission would have, rejected and never
    Ready. Pending pods kwok has not touched stay as they are, as on a machine that is down.
    Returns the pods refused."""
    now = api_time()
    refused = 0
    for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}", _request_timeout=REQUEST_TIMEOUT).items:
        status = pod.status
        if pod.metadata.deletion_timestamp or MIRROR_ANNOTATION in (pod.metadata.annotations or {}) \
                or status.phase in ("Succeeded", "Failed") or not (status.pod_ip or status.phase == "Running"):
            continue
        try:
            core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace,
                                             ended(pod, now, REJECTED_REASON, REJECTED_MESSAGE),
                                             _request_timeout=REQUEST_TIMEOUT)
            refused += 1
        except client.ApiException as e:
            if e.status != 404:
                raise
    return refused


def take_back_late_ready(core: client.CoreV1Api, pods: list[dict], left: dict[str, str]) -> list[str]:
    """Pods kwok made Ready on a Node after the lab took its Lease (`left`: Node name → when, as
    the API writes times). kwok plays a stage it queued while it held the Lease without looking
    at the Lease again (v0.7.0 pod_controller.go playStageWorker), so on a loaded machine a Ready
    queued before a crash can land after it, even after the node lifecycle controller's one
    MarkPodsNotReady pass: a pod Ready for good on a machine that is off. A stopped kubelet
    writes nothing, so the lab takes that Ready back as that pass would have written it (Ready
    False). `pods` as the API's JSON; returns the pods' namespace/name."""
    now = api_time()
    taken = []
    for pod in pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        since = left.get(spec.get("nodeName"))
        ready = api_json.condition(pod, "Ready")
        if since is None or meta.get("deletionTimestamp") or not ready or ready.get("status") != "True" \
                or (ready.get("lastTransitionTime") or "") < since:
            continue
        try:
            core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": {"conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": now}]}}, _request_timeout=REQUEST_TIMEOUT)
            taken.append(f"{meta['namespace']}/{meta['name']}")
        except client.ApiException as e:
            if e.status != 404:
                raise
    return taken


def drain(core: client.CoreV1Api, name: str, timeout: float = DRAIN_TIMEOUT) -> int:
    """Talos's CordonAndDrainNode (pkg/kubernetes Drain): cordon, then evict every pod on the node
    that a controller other than a DaemonSet owns (grace 60 s, again while a disruption budget
    refuses), and wait for them to go; bounded, as Talos's drain (logged, never fatal). Returns
    the pods evicted."""
    core.patch_node(name, {"spec": {"unschedulable": True}}, _request_timeout=REQUEST_TIMEOUT)
    deadline = time.monotonic() + timeout
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}", _request_timeout=REQUEST_TIMEOUT).items
    targets = [p for p in pods if MIRROR_ANNOTATION not in (p.metadata.annotations or {})
               and any(o.controller and o.kind != "DaemonSet" for o in p.metadata.owner_references or [])]
    evicted = []
    for pod in targets:
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace},
                "deleteOptions": {"gracePeriodSeconds": 60}}
        while True:
            try:
                core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body,
                                                    _request_timeout=REQUEST_TIMEOUT)
                evicted.append(pod)
                break
            except client.ApiException as e:
                if e.status == 404:
                    break
                if e.status != 429 or time.monotonic() > deadline:
                    log.warning("node %s: failed to evict pod %s/%s: %s", name, pod.metadata.namespace,
                                pod.metadata.name, e.reason)
                    break
                time.sleep(1.0)  # a disruption budget refuses for now
    while evicted and time.monotonic() < deadline:
        left = {p.metadata.uid for p in core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={name}", _request_timeout=REQUEST_TIMEOUT).items}
        evicted_left = [p for p in evicted if p.metadata.uid in left]
        if not evicted_left:
            break
        time.sleep(0.5)
    return len(evicted)


def terminated(pod, now: str) -> dict:
    """What the kubelet reports of a pod it terminated for a node shutdown (the containers ended
    on SIGTERM within their grace period)."""
    status = ended(pod, now, "Terminated", SHUTDOWN_MESSAGE)
    status["status"]["conditions"].insert(0, {
        "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": SHUTDOWN_MESSAGE,
        "lastProbeTime": None, "lastTransitionTime": now})
    return status


def ended(pod, now: str, reason: str, message: str) -> dict:
    """A pod status patch: Failed for `reason`, not Ready, its containers ended."""
    condition = {"status": "False", "reason": "PodFailed", "lastProbeTime": None, "lastTransitionTime": now}
    started = {c.name: (c.state.running.started_at if c.state and c.state.running else None)
               for c in (pod.status.container_statuses or [])}
    return {"status": {
        "phase": "Failed", "reason": reason, "message": message,
        "conditions": [{"type": "Ready", **condition}, {"type": "ContainersReady", **condition}],
        "containerStatuses": [{
            "name": c.name, "image": c.image, "imageID": "", "ready": False, "started": False, "restartCount": 0,
            "state": {"running": None, "waiting": None, "terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now,
                                     "startedAt": started.get(c.name).isoformat().replace("+00:00", "Z")
                                     if started.get(c.name) else now}},
        } for c in pod.spec.containers],
    }}


def api_time() -> str:
    """Now, as the API writes times (RFC 3339, whole seconds, UTC): what conditions carry."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
