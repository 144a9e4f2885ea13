"""Pod prober: is an addon usable, and if not, which pods are stuck and why.

Healthy means every pod of the addon is Running with its PodReady condition true, or
Succeeded (a finished one-shot Job such as cert-manager's startupapicheck). A Failed pod that a
ReplicaSet, DaemonSet or StatefulSet owns is not counted: their pods restart their containers
(restartPolicy Always), so only the kubelet ends one (a node's graceful shutdown, a rejection at
admission such as NodeShutdown or OutOfcpu, an eviction), its controller replaces it, and
Kubernetes keeps the ended pod until pod garbage collection. A Helm apply returns long before that,
so the gate is a separate, bounded wait (seeds, "Pod health").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kubernetes import client

from kontinuum.errors import KontinuumError
from kontinuum.kube import watching
from kontinuum.kube.clients import api_client

REQUEST_TIMEOUT = 15.0


class PodsNotHealthy(KontinuumError):
    pass


@dataclass(frozen=True)
class PodProblem:
    name: str
    phase: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} {self.phase}: {self.reason}"


def _condition(pod: client.V1Pod, kind: str):
    for c in pod.status.conditions or []:
        if c.type == kind:
            return c
    return None


def problem(pod: client.V1Pod) -> PodProblem | None:
    """None when the pod counts as healthy, else what is wrong with it in one line."""
    phase = pod.status.phase or "Unknown"
    name = pod.metadata.name
    if phase == "Succeeded":
        return None
    if phase == "Running":
        ready = _condition(pod, "Ready")
        if ready is not None and ready.status == "True":
            return None
        waiting = [
            f"{cs.name}: {cs.state.waiting.reason}"
            for cs in (pod.status.container_statuses or [])
            if cs.state and cs.state.waiting and cs.state.waiting.reason
        ]
        return PodProblem(name, phase, "; ".join(waiting) or "not Ready")
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.status != "True":
        return PodProblem(name, phase, scheduled.message or scheduled.reason or "not scheduled")
    return PodProblem(name, phase, pod.status.reason or pod.status.message or "waiting to start")


REPLACING = ("ReplicaSet", "DaemonSet", "StatefulSet")


def replaced(pod: client.V1Pod) -> bool:
    """Ended by its node's kubelet, with a controller that replaces it: neither a pod nor a problem."""
    owners = pod.metadata.owner_references or []
    return pod.status.phase == "Failed" and any(o.controller and o.kind in REPLACING for o in owners)


def probe(core: client.CoreV1Api, namespace: str, selector: str = "") -> tuple[int, list[PodProblem]]:
    pods = core.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT).items
    pods = [p for p in pods if not replaced(p)]
    return len(pods), [p for p in map(problem, pods) if p is not None]


def wait_healthy(kubeconfig: str, namespace: str, *, selector: str = "", min_pods: int = 1, timeout: float = 600.0,
                 interval: float = 3.0, what: str = "addon") -> int:
    """Block until the pods are healthy; returns how many there are. Bounded by `timeout`; looks
    again as soon as a pod changes (a watch), at the latest every `interval`."""
    core = client.CoreV1Api(api_client(kubeconfig))
    deadline = time.monotonic() + timeout
    last = "no observation yet"
    with watching.Waker((kubeconfig, watching.pods(namespace, selector))) as waker:
        while True:
            try:
                count, problems = probe(core, namespace, selector)
                if count >= min_pods and not problems:
                    return count
                if problems:
                    last = "; ".join(map(str, problems))
                else:
                    matching = f" matching {selector}" if selector else ""
                    last = f"{count} pod(s) in {namespace}{matching}, want >= {min_pods}"
            except Exception as e:  # noqa: BLE001 - an unreachable apiserver is an observation too
                last = f"cannot list pods: {e}"
            if time.monotonic() >= deadline:
                raise PodsNotHealthy(
                    f"{what}: pods in namespace {namespace} not healthy after {timeout:.0f} s; stuck: {last}. "
                    "Look at the pods' events (kubectl describe pod) and fix what blocks them, "
                    "then run `pulumi up` again."
                )
            waker.pause(min(interval, max(0.0, deadline - time.monotonic())))
