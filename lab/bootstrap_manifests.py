"""Talos's create-only ManifestApplyController for the lab's clusters: the objects of the
bootstrap manifests a control plane renders from its config (lab/talos_node/manifests.py) that do
not exist yet. Talos itself only CREATES missing objects, so a changed config (cluster.proxy.image)
reaches the cluster only through talosctl upgrade-k8s's manifest sync (ours: kontinuum/lifecycle/
bootstrap_manifests.py).

`create_missing` is the ManifestApplyController's part: it creates what does not exist (server-
side apply, field manager `talos`) and never updates or deletes; each creation lands in the node's event log
("manifest-created"), so tests can tell it from the upgrade's sync.
"""

from __future__ import annotations

import logging

from kubernetes import client

from lab.standins.loop import REQUEST_TIMEOUT

log = logging.getLogger(__name__)

FIELD_MANAGER = "talos"


def _path(obj: dict) -> str:
    """The collection path of one of the kinds render() makes."""
    group_version, kind, md = obj["apiVersion"], obj["kind"], obj["metadata"]
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    plural = kind.lower() + "s"
    return f"{base}/namespaces/{md['namespace']}/{plural}" if md.get("namespace") else f"{base}/{plural}"


def create_missing(api: client.ApiClient, machine, manifests: dict[str, list[dict]], known: set) -> None:
    """Create each object that does not exist yet (never update one), server-side applied as
    field manager `talos`, as Talos 1.13 does, so the later upgrade sync (the same manager) owns
    the same fields. `known` holds the objects already seen: each is looked at once per runner."""
    for rid in sorted(manifests):
        for obj in manifests[rid]:
            key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if key in known:
                continue
            path = f"{_path(obj)}/{obj['metadata']['name']}"
            try:
                _call(api, path, "GET")
            except client.ApiException as e:
                if e.status != 404:
                    raise
                _call(api, path, "PATCH", obj, [("fieldManager", FIELD_MANAGER)], "application/apply-patch+yaml")
                machine.record("manifest-created", manifest=rid, object=f"{obj['kind']} {obj['metadata']['name']}")
                log.info("node %s: created %s %s from manifest %s", machine.address, key[0], key[2], rid)
            known.add(key)


def _call(api: client.ApiClient, path: str, method: str, body: dict | None = None, query=None, content_type=None):
    headers = {"Accept": "application/json", **({"Content-Type": content_type} if content_type else {})}
    return api.call_api(path, method, query_params=query or [], header_params=headers, body=body,
                        auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True,
                        _request_timeout=REQUEST_TIMEOUT)
