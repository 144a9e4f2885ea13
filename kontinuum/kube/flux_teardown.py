"""Flux objects an uninstall would leave stuck.

The Flux Operator's uninstall (v0.58.1 internal/controller/fluxinstance_uninstaller.go) deletes
the controllers' Deployments (background propagation: their pods still run for a moment), removes
Flux's finalizer from every Flux object, then deletes the rest and waits, up to 5 minutes, for the
CRDs to go. A controller still running in that moment puts its finalizer back on an object it
reconciles (kustomize-controller adds it to any Kustomization without one; seen in a CI run), then
stops: nothing removes that finalizer any more, so the object, its CRD, the operator's wait and the
flux-system namespace all hang. Once no Flux controller pod is left, an object being deleted that
still carries Flux's finalizer can never be finalized: `release_orphans` removes it, as the
operator's own uninstall meant to.
"""

from __future__ import annotations

from kubernetes import client

FLUX_FINALIZER = "finalizers.fluxcd.io"
FLUX_GROUP_SUFFIX = ".toolkit.fluxcd.io"
CONTROLLERS = ("source-controller", "kustomize-controller", "helm-controller", "notification-controller",
               "image-reflector-controller", "image-automation-controller", "source-watcher")
REQUEST_TIMEOUT = 15.0


def release_orphans(api: client.ApiClient, namespace: str) -> list[str]:
    """Remove Flux's finalizer from Flux objects being deleted, once no Flux controller pod is left
    in `namespace` to finalize them. Returns the objects released ("Kind namespace/name")."""
    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"app in ({','.join(CONTROLLERS)})", _request_timeout=REQUEST_TIMEOUT).items
    if pods:
        return []  # a controller may still finalize them itself
    custom = client.CustomObjectsApi(api)
    released = []
    for group, version, plural in _flux_kinds(api):
        listed = custom.list_cluster_custom_object(group, version, plural, _request_timeout=REQUEST_TIMEOUT)
        for obj in listed.get("items") or []:
            if stuck(obj):
                if _release(custom, group, version, plural, obj):
                    md = obj["metadata"]
                    released.append(f"{obj.get('kind')} {md.get('namespace')}/{md['name']}")
    return released


def stuck(obj: dict) -> bool:
    """Being deleted and held by Flux's finalizer."""
    md = obj.get("metadata") or {}
    return bool(md.get("deletionTimestamp")) and FLUX_FINALIZER in (md.get("finalizers") or [])


def without_finalizer(obj: dict) -> dict:
    """The merge patch removing Flux's finalizer only, refused if the object changed since read."""
    md = obj["metadata"]
    return {"metadata": {"resourceVersion": md["resourceVersion"],
                         "finalizers": [f for f in md.get("finalizers") or [] if f != FLUX_FINALIZER]}}


def _release(custom: client.CustomObjectsApi, group: str, version: str, plural: str, obj: dict) -> bool:
    md = obj["metadata"]
    try:
        if md.get("namespace"):
            custom.patch_namespaced_custom_object(group, version, md["namespace"], plural, md["name"],
                                                  without_finalizer(obj), _request_timeout=REQUEST_TIMEOUT)
        else:
            custom.patch_cluster_custom_object(group, version, plural, md["name"], without_finalizer(obj),
                                               _request_timeout=REQUEST_TIMEOUT)
        return True
    except client.ApiException as e:
        if e.status in (404, 409):  # gone, or changed since read: looked at again on the next poll
            return False
        raise


def _flux_kinds(api: client.ApiClient) -> list[tuple[str, str, str]]:
    """(group, served version, plural) of every Flux CRD in the cluster."""
    crds = client.ApiextensionsV1Api(api).list_custom_resource_definition(_request_timeout=REQUEST_TIMEOUT).items
    kinds = []
    for crd in crds:
        if not crd.spec.group.endswith(FLUX_GROUP_SUFFIX):
            continue
        served = [v.name for v in crd.spec.versions if v.served]
        storage = next((v.name for v in crd.spec.versions if v.storage and v.served), served[0] if served else None)
        if storage:
            kinds.append((crd.spec.group, storage, crd.spec.names.plural))
    return kinds
