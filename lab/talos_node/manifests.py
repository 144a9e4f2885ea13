"""Talos's bootstrap manifests as an emulated control plane renders them from its CURRENT machine
config: served as COSI `Manifests.kubernetes.talos.dev` resources (namespace `controlplane`), one
per id, each a list of Kubernetes objects, which talosctl upgrade-k8s reads
(manifests.GetBootstrapManifests) and server-side applies (reference/day2-facts.md §2 phase 5).

The lab renders a cut-down set (ours, not Talos's templates): `10-kube-proxy` when
cluster.proxy.disabled is not true (ServiceAccount, ClusterRoleBinding and DaemonSet with image
cluster.proxy.image) and `11-kube-config-in-cluster` (the in-cluster kubeconfig ConfigMap). Not
rendered: CoreDNS, flannel, the bootstrap RBAC and tokens, extra/inline manifests.
"""

from __future__ import annotations

TYPE = "Manifests.kubernetes.talos.dev"
NAMESPACE = "controlplane"
DEFAULT_PROXY_IMAGE = "registry.k8s.io/kube-proxy:v1.35.4"
_PROXY_LABELS = {"tier": "node", "k8s-app": "kube-proxy"}


def _kube_proxy(image: str) -> list[dict]:
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-proxy", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "kube-proxy"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier"},
         "subjects": [{"kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system"}]},
        {"apiVersion": "apps/v1", "kind": "DaemonSet",
         "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": dict(_PROXY_LABELS)},
         "spec": {"selector": {"matchLabels": dict(_PROXY_LABELS)},
                  "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                  "template": {"metadata": {"labels": dict(_PROXY_LABELS)}, "spec": {
                      "hostNetwork": True, "priorityClassName": "system-node-critical",
                      "serviceAccountName": "kube-proxy", "tolerations": [{"operator": "Exists"}],
                      "containers": [{"name": "kube-proxy", "image": image,
                                      "command": ["/usr/local/bin/kube-proxy", "--proxy-mode=iptables"]}]}}}},
    ]


def _kubeconfig_in_cluster() -> list[dict]:
    kubeconfig = ("apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n"
                  "    server: https://127.0.0.1:7445\n"
                  "    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n"
                  "users:\n- name: service-account\n  user:\n"
                  "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n"
                  "contexts:\n- context:\n    cluster: local\n    user: service-account\n")
    return [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "kubeconfig-in-cluster", "namespace": "kube-system"},
             "data": {"kubeconfig": kubeconfig}}]


def render(doc: dict) -> dict[str, list[dict]]:
    """id → objects of the Manifest resources a control plane with v1alpha1 document `doc` serves."""
    proxy = ((doc.get("cluster") or {}).get("proxy")) or {}
    out: dict[str, list[dict]] = {}
    if not proxy.get("disabled"):
        out["10-kube-proxy"] = _kube_proxy(str(proxy.get("image") or DEFAULT_PROXY_IMAGE))
    out["11-kube-config-in-cluster"] = _kubeconfig_in_cluster()
    return out
