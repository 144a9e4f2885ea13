"""A Cilium agent stand-in for integration labs without addons: a DaemonSet whose pods kwok runs
on every Node, so the lab marks each Node's network ready and Nodes turn Ready (lab/kwok), as
Cilium's agent makes them on a real zone."""

from __future__ import annotations

from kubernetes import client

LABELS = {"app.kubernetes.io/part-of": "cilium", "k8s-app": "cilium"}
CNI_AGENT = {
    "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "cilium", "labels": LABELS},
    "spec": {"selector": {"matchLabels": LABELS}, "template": {"metadata": {"labels": LABELS}, "spec": {
        "hostNetwork": True, "automountServiceAccountToken": False, "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "agent", "image": "quay.io/cilium/cilium:v1.18.4"}]}}}}


def install(api: client.ApiClient, timeout: float = 15.0) -> client.V1DaemonSet:
    return client.AppsV1Api(api).create_namespaced_daemon_set("kube-system", CNI_AGENT, _request_timeout=timeout)
