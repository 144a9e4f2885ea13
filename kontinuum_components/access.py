"""The RBAC that people's kubeconfigs rely on (`python -m kontinuum kubeconfig`, kontinuum/people.py):
each zone binds the groups kontinuum:view, kontinuum:edit and kontinuum:admin to Kubernetes's
built-in ClusterRoles view, edit and cluster-admin. A person's certificate carries one of these
groups, never system:masters, so deleting a binding takes that power back."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from kontinuum.people import KUBE_GROUPS


def people_bindings(cluster, after: list[pulumi.Resource]) -> list[k8s.rbac.v1.ClusterRoleBinding]:
    """One ClusterRoleBinding per group, on the zone's cluster (children of its TalosCluster)."""
    return [
        k8s.rbac.v1.ClusterRoleBinding(
            f"{cluster.name}-{group.replace(':', '-')}",
            metadata={"name": group.replace(":", "-"), "labels": {"app.kubernetes.io/managed-by": "kontinuum"}},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            subjects=[{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
            opts=cluster.on_cluster(depends_on=after))
        for group, role in KUBE_GROUPS.items()
    ]
