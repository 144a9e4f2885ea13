"""Drain a machine's Kubernetes Node before the machine is reset, and remove the Node after.

The order is kubectl drain's: cordon, then evict every pod that a controller would move
(not DaemonSet pods, not static/mirror pods, not pods already finished or terminating)
through the Eviction API, so PodDisruptionBudgets are respected (HTTP 429 is retried), until
every such pod has been evicted (it then terminates with its grace period, as Talos's own
graceful reset expects). Everything is bounded; past the bound a DrainTimeout names
the pods still there. The Node is found by the machine's address (its InternalIP), because
the machine's name in Kubernetes is its hostname, which the stack never chose.
"""

from __future__ import annotations

import time
from typing import Callable

from kubernetes import client

from kontinuum.errors import KontinuumError
from kontinuum.kube.clients import api_client, describe_error

REQUEST_TIMEOUT = 10.0  # seconds per API call
POLL = 1.0  # seconds between eviction rounds
CORDONED_BY = "kontinuum.sh/cordoned-for"  # on a Node we cordoned: why (e.g. talos-upgrade)


class DrainTimeout(KontinuumError):
    pass


def node_for(core: client.CoreV1Api, address: str) -> client.V1Node | None:
    for node in core.list_node(_request_timeout=REQUEST_TIMEOUT).items:
        if any(a.address == address and a.type == "InternalIP" for a in (node.status.addresses or [])
               if node.status):
            return node
    return None


def internal_ips(kubeconfig: str) -> list[str]:
    """The InternalIP of every Node the cluster has now."""
    api = api_client(kubeconfig)
    try:
        nodes = client.CoreV1Api(api).list_node(_request_timeout=REQUEST_TIMEOUT).items
    finally:
        api.close()
    return [a.address for n in nodes for a in (n.status.addresses or []) if n.status and a.type == "InternalIP"]


def _movable(pod: client.V1Pod) -> bool:
    if pod.metadata.deletion_timestamp is not None or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
        return False
    if "kubernetes.io/config.mirror" in (pod.metadata.annotations or {}):
        return False  # a static pod: the kubelet's own, it goes with the machine
    return not any(o.kind == "DaemonSet" for o in pod.metadata.owner_references or [])


def _pods_on(core: client.CoreV1Api, node: str) -> list[client.V1Pod]:
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", _request_timeout=REQUEST_TIMEOUT)
    return [p for p in pods.items if _movable(p)]


def drain(kubeconfig: str, address: str, *, timeout: float, log: Callable[[str], None],
          reason: str | None = None) -> str | None:
    """Cordon and drain the Node of the machine at `address`; returns its name (None when the
    cluster has no Node for it: nothing runs there). With `reason`, the Node is marked as
    cordoned by us for it (CORDONED_BY), so uncordon() later undoes only our own cordon."""
    api = api_client(kubeconfig)
    try:
        core = client.CoreV1Api(api)
        node = node_for(core, address)
        if node is None:
            log(f"{address}: no Kubernetes Node has this address; nothing to drain")
            return None
        name = node.metadata.name
        patch: dict = {"spec": {"unschedulable": True}}
        if reason and not node.spec.unschedulable:  # someone else's cordon stays theirs
            patch["metadata"] = {"annotations": {CORDONED_BY: reason}}
        core.patch_node(name, patch, _request_timeout=REQUEST_TIMEOUT)
        deadline = time.monotonic() + timeout
        blocked: dict[str, str] = {}
        while pods := _pods_on(core, name):
            blocked = {}
            for pod in pods:
                ref = f"{pod.metadata.namespace}/{pod.metadata.name}"
                body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.metadata.name,
                                                                      namespace=pod.metadata.namespace))
                try:
                    core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body,
                                                        _request_timeout=REQUEST_TIMEOUT)
                except client.ApiException as e:
                    if e.status != 404:
                        blocked[ref] = "a PodDisruptionBudget allows no disruption now" if e.status == 429 else \
                            describe_error(e)
            if time.monotonic() >= deadline:
                detail = "; ".join(f"{p}: {why}" for p, why in sorted(blocked.items())) or "evicted, not yet gone"
                raise DrainTimeout(
                    f"Node {name} ({address}): {len(pods)} pod(s) still there after {timeout:g} s of draining "
                    f"({detail}). The machine was not reset. Let those workloads move (scale up elsewhere or relax "
                    "their PodDisruptionBudgets), then run `pulumi up` again.")
            time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
        log(f"{address}: Node {name} cordoned and drained")
        return name
    finally:
        api.close()


def cordoned_for(kubeconfig: str, address: str) -> str | None:
    """Why we cordoned the Node of the machine at `address` (CORDONED_BY), None if we did not."""
    api = api_client(kubeconfig)
    try:
        node = node_for(client.CoreV1Api(api), address)
        return None if node is None else (node.metadata.annotations or {}).get(CORDONED_BY)
    finally:
        api.close()


def uncordon(kubeconfig: str, address: str, reason: str) -> str | None:
    """Make the Node of the machine at `address` schedulable again if we cordoned it for
    `reason` (a resumed run finds the mark); returns its name when it was uncordoned."""
    api = api_client(kubeconfig)
    try:
        core = client.CoreV1Api(api)
        node = node_for(core, address)
        if node is None or (node.metadata.annotations or {}).get(CORDONED_BY) != reason:
            return None
        core.patch_node(node.metadata.name, {"spec": {"unschedulable": False},
                                             "metadata": {"annotations": {CORDONED_BY: None}}},
                        _request_timeout=REQUEST_TIMEOUT)
        return node.metadata.name
    finally:
        api.close()


def delete_node(kubeconfig: str, name: str) -> None:
    """Remove the Node object of a machine that left (its kubelet is gone with the reset)."""
    api = api_client(kubeconfig)
    try:
        client.CoreV1Api(api).delete_node(name, _request_timeout=REQUEST_TIMEOUT)
    except client.ApiException as e:
        if e.status != 404:
            raise
    finally:
        api.close()
