"""Pods kwok missed: bound to a Node whose kubelet runs, and never started.

kwok v0.7.0 decides whether it plays a Node from its Lease cache (an informer) when a pod's event
arrives (pkg/kwok/controllers, pod_controller.go watchResources: readOnly). When it takes a Lease
(a Node just registered, or the lab let a rebooted machine's Lease go) it lists the pods bound to
the Node and feeds them through that same check (controller.go podsOnNodeSyncWorker), which can
run before its cache holds its own renewal: each pod is then skipped as read-only and, since
nothing changes a Pending pod, never looked at again. Seen under load: a rebooted worker's new
Cilium agent Pending for good, so its Node never Ready. A kubelet syncs every pod bound to it
while it runs, so the lab touches each pod left that way (SYNC_ANNOTATION, the time it did) and
kwok's next look at it finds the Lease its own.
"""

from __future__ import annotations

import datetime as dt
import time

from kubernetes import client

from lab.kubelets import MIRROR_ANNOTATION
from lab.standins.loop import REQUEST_TIMEOUT

SYNC_ANNOTATION = "lab.kontinuum.sh/kubelet-sync"
# Seconds a pod may wait once it and its Node's running kubelet both exist: kwok takes a Lease
# within 3 s (lab/kwok LEASE_SECONDS / 4) and starts a pod within 1 s of seeing it.
GRACE = 6.0


def missed(pods: list[dict], running_since: dict[str, float], now: float, grace: float = GRACE) -> list[dict]:
    """Pods (the API's JSON) Pending without an IP on a Node whose kubelet has run since
    `running_since[node]`, that nothing started or touched in the last `grace` seconds."""
    found = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        since = running_since.get(spec.get("nodeName"))
        annotations = meta.get("annotations") or {}
        if since is None or meta.get("deletionTimestamp") or MIRROR_ANNOTATION in annotations \
                or status.get("phase") != "Pending" or status.get("podIP"):
            continue
        created = dt.datetime.fromisoformat(meta["creationTimestamp"]).timestamp()
        touched = float(annotations.get(SYNC_ANNOTATION) or 0.0)
        if now - max(since, created, touched) >= grace:
            found.append(pod)
    return found


def resync(core: client.CoreV1Api, pods: list[dict], running_since: dict[str, float],
           now: float | None = None) -> list[str]:
    """Touch every pod of `pods` (the cluster's, as the API's JSON) kwok missed (see the module
    docstring); returns their namespace/name."""
    now = time.time() if now is None else now
    touched = []
    for pod in missed(pods, running_since, now):
        meta = pod["metadata"]
        try:
            core.patch_namespaced_pod(meta["name"], meta["namespace"],
                                      {"metadata": {"annotations": {SYNC_ANNOTATION: f"{now:.3f}"}}},
                                      _request_timeout=REQUEST_TIMEOUT)
            touched.append(f"{meta['namespace']}/{meta['name']}")
        except client.ApiException as e:
            if e.status != 404:
                raise
    return touched
