"""The Flux hand-off on a zone cluster (seed 002), as objects: what Kontinuum hands to the
Flux Operator. Pure, so the program builds them without a Kubernetes client.

- operator_values: the chart values that let the operator run before pod networking exists
  (host network, the API through Talos KubePrism on localhost:7445 instead of the kubernetes
  Service ClusterIP, tolerations for a node that is not Ready yet);
- instance_manifest: the FluxInstance `flux` (distribution, components, sync) and, with
  suspendApps, a patch on the generated sync Kustomization that makes kustomize-controller
  apply the named application Kustomizations with `spec.suspend: true`;
- credential_secret: a credential in the layout Flux's source controllers read;
- owned_view: what a live FluxInstance shows of the fields we set (drift on refresh).
"""

from __future__ import annotations

import base64
import json
from urllib.parse import urlsplit

GROUP, VERSION, PLURAL, KIND = "fluxcd.controlplane.io", "v1", "fluxinstances", "FluxInstance"
INSTANCE_NAME = "flux"  # the only name the FluxInstance CRD allows
KUBEPRISM_HOST, KUBEPRISM_PORT = "localhost", 7445
MANAGED_BY = {"app.kubernetes.io/managed-by": "kontinuum"}

# What a node carries before its CNI is up (node lifecycle controller) and on a control plane.
PRE_CNI_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.cilium.io/agent-not-ready", "operator": "Exists"},
]


# Top-level value names the upstream chart documents (controlplaneio-fluxcd/charts,
# charts/flux-operator/values.yaml, chart 0.49.0: the newest chart source readable here; no
# artifact of the chart at the pinned 0.58.1 is reachable from this machine). Ours must be among them.
UPSTREAM_CHART_VALUES = frozenset({
    "nameOverride", "fullnameOverride", "multitenancy", "reporting", "web", "installCRDs", "commonAnnotations",
    "commonLabels", "image", "priorityClassName", "apiPriority", "resources", "livenessProbe", "readinessProbe",
    "serviceAccount", "rbac", "podSecurityContext", "securityContext", "affinity", "tolerations", "nodeSelector",
    "hostNetwork", "extraVolumes", "extraEnvs", "extraArgs", "extraVolumeMounts", "logLevel", "serviceMonitor",
    "service", "marketplace"})


def operator_values() -> dict:
    """The seed's pre-CNI settings, under the upstream chart's value names."""
    return {
        "hostNetwork": True,
        "extraEnvs": [{"name": "KUBERNETES_SERVICE_HOST", "value": KUBEPRISM_HOST},
                      {"name": "KUBERNETES_SERVICE_PORT", "value": str(KUBEPRISM_PORT)}],
        "tolerations": PRE_CNI_TOLERATIONS,
        "installCRDs": True,
    }


def suspend_patch(namespace: str, apps: list[str]) -> dict:
    """A FluxInstance kustomize patch on the sync Kustomization (named after the namespace):
    it gains `spec.patches` setting `spec.suspend: true` on the named Kustomizations."""
    inner = {"target": {"group": "kustomize.toolkit.fluxcd.io", "kind": "Kustomization",
                        "name": "^(" + "|".join(apps) + ")$"},
             "patch": json.dumps([{"op": "add", "path": "/spec/suspend", "value": True}])}
    return {"target": {"group": "kustomize.toolkit.fluxcd.io", "kind": "Kustomization", "name": namespace},
            "patch": json.dumps([{"op": "add", "path": "/spec/patches", "value": [inner]}])}


def instance_manifest(*, namespace: str, version: str, registry: str, components: list[str], kind: str, url: str,
                      ref: str, path: str, interval: str, pull_secret: str | None, suspend_apps: bool,
                      apps: list[str]) -> dict:
    sync = {"kind": kind, "url": url, "ref": ref, "path": path, "interval": interval}
    if pull_secret:
        sync["pullSecret"] = pull_secret
    spec: dict = {"distribution": {"version": version, "registry": registry}, "components": list(components),
                  "cluster": {"type": "kubernetes"}, "sync": sync}
    if suspend_apps:
        spec["kustomize"] = {"patches": [suspend_patch(namespace, apps)]}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": INSTANCE_NAME, "namespace": namespace, "labels": dict(MANAGED_BY)}, "spec": spec}


def credential_secret(*, name: str, namespace: str, source_url: str | None, ssh_private_key: str | None = None,
                      known_hosts: str | None = None, username: str | None = None, token: str | None = None) -> dict:
    """The Secret Flux reads: `identity` + `known_hosts` (SSH Git), `username` + `password`
    (HTTPS Git) or a docker config (OCI registry)."""
    meta = {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)}
    if ssh_private_key:
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
                "stringData": {"identity": ssh_private_key, "known_hosts": known_hosts or ""}}
    user = username or "git"
    if source_url and source_url.startswith("oci://"):
        host = urlsplit(source_url).netloc
        auth = base64.b64encode(f"{user}:{token}".encode()).decode()
        config = json.dumps({"auths": {host: {"username": user, "password": token, "auth": auth}}})
        return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson", "metadata": meta,
                "stringData": {".dockerconfigjson": config}}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
            "stringData": {"username": user, "password": token or ""}}


def owned_view(ours: dict, live: dict) -> dict:
    """The live object projected onto the shape of `ours`: every key we set, with the live value
    (absent keys are dropped, so a removed field is drift too). Fields others set (the API's
    defaults, status, a person's additions next to ours) do not count."""
    view = {}
    for key, value in ours.items():
        if key not in live:
            continue
        mine, theirs = value, live[key]
        view[key] = owned_view(mine, theirs) if isinstance(mine, dict) and isinstance(theirs, dict) else theirs
    return view


def instance_view(ours: dict, live: dict) -> dict:
    """owned_view for a FluxInstance: apiVersion, kind, name and namespace are ours by identity;
    `spec.kustomize` (the suspendApps patch) counts even when we do not set it, since a patch
    someone added there changes what Flux applies."""
    view = owned_view(ours, live)
    extra = (live.get("spec") or {}).get("kustomize")
    if extra is not None and "kustomize" not in (ours.get("spec") or {}):
        view.setdefault("spec", {})["kustomize"] = extra
    return view
