"""Talos's Kubernetes-level health checks, judged from what the lab's real apiserver says (pure)."""

from __future__ import annotations

from typing import Iterable

from lab import api_json

CNI_NAMESPACE = "kube-system"
CNI_SELECTOR = "app.kubernetes.io/part-of=cilium"

CHECK_NODES_REPORT = "all k8s nodes to report"
CHECK_CONTROL_PLANE = "all control plane components to be ready"
CHECK_NODES_READY = "all k8s nodes to report ready"
CHECK_CILIUM = "cilium to report ready"  # the lab's analogue of Talos's "kube-proxy/coredns to report ready"



def _go_quoted(items: Iterable[str]) -> str:
    """Go's %q of a []string, as Talos prints node IP lists."""
    return "[" + " ".join(f'"{i}"' for i in items) + "]"


def _condition(obj, type_: str):
    return next((c for c in (obj.status.conditions or []) if c.type == type_), None) if obj.status else None


def internal_ip(node) -> str | None:
    return next((a.address for a in (node.status.addresses or []) if a.type == "InternalIP"), None) if node.status else None


def nodes_report_problem(expected: Iterable[str], nodes: list) -> str | None:
    want = sorted(set(expected))
    got = sorted({ip for n in nodes if (ip := internal_ip(n))})
    if want == got:
        return None
    return f"expected node internal IPs {_go_quoted(want)} but got {_go_quoted(got)}"


def nodes_ready_problem(nodes: list) -> str | None:
    not_ready = [n.metadata.name for n in nodes if not ((c := _condition(n, "Ready")) and c.status == "True")]
    return f"some nodes are not ready: [{' '.join(not_ready)}]" if not_ready else None


def _why_not_ready(pod) -> str:
    phase = (pod.status.phase if pod.status else None) or "Pending"
    if not pod.spec.node_name:
        scheduled = _condition(pod, "PodScheduled")
        reason = (scheduled.message or scheduled.reason) if scheduled and scheduled.status == "False" else "not scheduled yet"
        return f"{phase}: {reason}"
    return f"{phase} on {pod.spec.node_name}"


def cilium_problem(pods: list, daemonsets: list) -> str | None:
    """None when Cilium is not installed (no agent DaemonSet) or all its pods are Ready."""
    if not daemonsets:
        return None
    live = [p for p in pods if not p.metadata.deletion_timestamp and (p.status and p.status.phase) != "Failed"]
    if not live:
        return f"no pods found for namespace {CNI_NAMESPACE!r} and label selector {CNI_SELECTOR!r}"
    not_ready = [p for p in live if not ((c := _condition(p, "Ready")) and c.status == "True")]
    if not not_ready:
        return None
    details = "; ".join(f"{p.metadata.name} ({_why_not_ready(p)})" for p in sorted(not_ready, key=lambda p: p.metadata.name))
    return f"some pods are not ready: {' '.join(details.splitlines())}"


def cni_ready_nodes(pods: list[dict]) -> set[str]:
    """Nodes whose Cilium agent (a DaemonSet pod of the CNI selector) is Ready; `pods` as the
    API's JSON (the node sync's one list of the cluster's pods), any namespace or label."""
    key, _, value = CNI_SELECTOR.partition("=")
    ready = set()
    for p in pods:
        meta, spec = p["metadata"], p.get("spec") or {}
        if meta.get("namespace") != CNI_NAMESPACE or (meta.get("labels") or {}).get(key) != value:
            continue
        if meta.get("deletionTimestamp") or not spec.get("nodeName") \
                or not any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
            continue
        if api_json.is_ready(p):
            ready.add(spec["nodeName"])
    return ready
