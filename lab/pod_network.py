"""Pod network (lab stand-in): whether a host-network pod's API client reaches the apiserver.

kwok-played pods run nothing, so the lab decides what a real node's network would do for the
one case the seeds document (seed 002): a host-network pod whose in-cluster client uses the
kubernetes Service ClusterIP (Kubernetes injects KUBERNETES_SERVICE_HOST=<ClusterIP>) reaches
it only through the Service dataplane, which Cilium provides (kube-proxy is disabled). Until
the node's Cilium agent is Ready the dial times out and the container exits with an error (the
kubelet reports the exit, not the client's words); a pod that overrides the env (Talos
KubePrism, localhost:7445) runs at once. A process the lab runs for such a pod
(lab/pod_processes.py) dials what the pod's env names, for real.

With kube-proxy enabled in the machine config its host rules serve the ClusterIP without a CNI,
so every such pod is reachable. kwok's stages (lab/kwok/stages.yaml) hold such pods in Pending until this module annotates a
verdict: `reachable` (they run) or `unreachable` (Error, or crash-looping until reachable).
"""

from __future__ import annotations

from kubernetes import client

from lab.kwok import CNI_READY_ANNOTATION
from lab.standins.loop import REQUEST_TIMEOUT

VERDICT = "lab.kontinuum.sh/service-network"


def uses_service_ip(pod: dict) -> bool:
    """The jq gate of stages.yaml in Python: host network, an API token, and a container that
    keeps the injected KUBERNETES_SERVICE_HOST (the ClusterIP). `pod` is the API's JSON."""
    spec = pod.get("spec") or {}
    if not spec.get("hostNetwork") or spec.get("automountServiceAccountToken") is False:
        return False
    return any(not any(e.get("name") == "KUBERNETES_SERVICE_HOST" for e in (c.get("env") or []))
               for c in spec.get("containers") or [])


def verdict(pod: dict, cni_ready: bool) -> str | None:
    """The annotation a pod (the API's JSON) should carry now, or None to leave it as it is."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    current = (meta.get("annotations") or {}).get(VERDICT)
    if meta.get("deletionTimestamp") or not spec.get("nodeName") or not uses_service_ip(pod):
        return None
    if cni_ready:
        # A failed Job pod stays failed; a crash-looping one restarts into a working network.
        return None if current == "reachable" or (pod.get("status") or {}).get("phase") == "Failed" else "reachable"
    return None if current else "unreachable"


def reconcile(core: client.CoreV1Api, nodes: dict, pods: list[dict], *, kube_proxy: bool = False) -> None:
    """Annotate every host-network ClusterIP client among `pods` with its verdict. With Talos's
    kube-proxy enabled, its host rules serve the ClusterIP before any CNI: reachable.

    Runs every second on every lab cluster: pods are read as plain JSON (the caller's one list),
    since building the client's model objects for every pod cost more CPU than the rest of the
    lab together."""
    try:
        core.read_namespaced_service("kubernetes", "default", _request_timeout=REQUEST_TIMEOUT)
    except client.ApiException as e:
        if e.status == 404:
            return  # the apiserver has not created it yet: no client can have been given its address
        raise
    ready = {name for name, n in nodes.items() if (n.metadata.annotations or {}).get(CNI_READY_ANNOTATION) == "true"}
    for pod in pods:
        want = verdict(pod, kube_proxy or pod["spec"].get("nodeName") in ready)
        if want is not None:
            core.patch_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"],
                                      {"metadata": {"annotations": {VERDICT: want}}},
                                      _request_timeout=REQUEST_TIMEOUT)
