"""The last phase of a Kubernetes upgrade: talosctl upgrade-k8s's bootstrap-manifest sync
(reference/day2-facts.md §2 phase 5), done by us. No Pulumi.

Talos renders its bootstrap manifests (kube-proxy with cluster.proxy.image, CoreDNS, the
bootstrap RBAC, extra and inline manifests) from a control plane's machine config into COSI
`Manifests.kubernetes.talos.dev` resources, but applies only the objects that do not exist yet;
so a new kube-proxy image reaches the cluster only through this sync. As manifests.
GetBootstrapManifests does, we list those resources on ONE control plane (whose config is the
target by then) and take every object of every resource, in resource-id order; then we
server-side apply them as field manager `talos` (what talosctl ≥ 1.13 uses, so ownership stays
Talos's), Namespaces and CRDs first, then ConfigMaps and Secrets, then the rest (talosctl's
stages); then wait, bounded, until the applied DaemonSets, Deployments and StatefulSets have
rolled out, naming the ones that did not.

Not done (talosctl does them): no pruning and no inventory. talosctl 1.13 records what it applied
in the ConfigMap `talos-bootstrap-manifests-inventory` (kube-system) and deletes objects that left
the manifests (e.g. kube-proxy after cluster.proxy.disabled); we never delete, and neither read nor
write that inventory, so an object Talos stopped rendering stays until an operator removes it. A
field conflict with another manager is reported, not forced (talosctl's default, no
--manifests-force). Service clusterIPs are not touched by apply, as the applied objects carry none.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable

import yaml
from kubernetes import client

from kontinuum.errors import KontinuumError
from kontinuum.kube.clients import describe_error
from kontinuum.talos.client import TalosClient
from kontinuum.talos.waits import WAIT_DEFAULTS, NotYet, wait_until
from protos.gen.v1alpha1 import state_grpc, state_pb2

MANIFEST_TYPE = "Manifests.kubernetes.talos.dev"
MANIFEST_NAMESPACE = "controlplane"
FIELD_MANAGER = "talos"
REQUEST_TIMEOUT = 10.0  # seconds per call
READ_DEADLINE = 30.0
_FIRST = ({"Namespace", "CustomResourceDefinition"}, {"ConfigMap", "Secret"})
_POLL = dataclasses.replace(WAIT_DEFAULTS, first_pause=0.5, max_pause=2.0)  # talosctl polls every 2 s


class ManifestSyncError(KontinuumError):
    """The bootstrap manifests could not be read, applied, or did not roll out in time."""


def read(talos: TalosClient, *, timeout: float = READ_DEADLINE) -> list[dict]:
    """Every object of the node's Manifest resources, resource ids in order (COSI List; the spec
    of each resource is the YAML list of its objects)."""
    request = state_pb2.ListRequest(namespace=MANIFEST_NAMESPACE, type=MANIFEST_TYPE)

    async def body(channel: Any, md: dict, t: float) -> list[tuple[str, str]]:
        replies = await state_grpc.StateStub(channel).List(request, timeout=t, metadata=md)
        return [(r.resource.metadata.id, r.resource.spec.yaml_spec) for r in replies]

    objects: list[dict] = []
    for rid, text in sorted(talos._run("manifests", timeout, body)):
        try:
            items = yaml.safe_load(text or "[]") or []
        except yaml.YAMLError as e:
            raise ManifestSyncError(f"{talos.node}: bootstrap manifest {rid} is not YAML ({e})") from e
        if not isinstance(items, list) or not all(isinstance(o, dict) and o.get("kind") for o in items):
            raise ManifestSyncError(f"{talos.node}: bootstrap manifest {rid} is not a list of Kubernetes objects")
        objects += items
    return objects


def ordered(objects: list[dict]) -> list[dict]:
    """talosctl's apply stages; the order within a stage is kept."""
    def stage(o: dict) -> int:
        return next((i for i, kinds in enumerate(_FIRST) if o.get("kind") in kinds), len(_FIRST))
    return sorted(objects, key=stage)


def describe(obj: dict) -> str:
    md = obj.get("metadata") or {}
    where = f"{md['namespace']}/" if md.get("namespace") else ""
    return f"{obj.get('kind')} {where}{md.get('name')}"


class _Paths:
    """Where each kind lives, from the API's discovery (one call per group version)."""

    def __init__(self, api: client.ApiClient):
        self.api = api
        self.lists: dict[str, dict[str, tuple[str, bool]]] = {}

    def of(self, obj: dict) -> str:
        gv, kind, md = obj["apiVersion"], obj["kind"], obj.get("metadata") or {}
        if gv not in self.lists:
            path = "/api/v1" if gv == "v1" else f"/apis/{gv}"
            found = _call(self.api, path, "GET")
            self.lists[gv] = {r["kind"]: (r["name"], bool(r.get("namespaced")))
                              for r in found.get("resources", []) if "/" not in r["name"]}
        if kind not in self.lists[gv]:
            del self.lists[gv]  # a CRD of this sync may define it: discovery is read again next time
            raise ManifestSyncError(f"the cluster API serves no {kind} in {gv} (for {describe(obj)})")
        plural, namespaced = self.lists[gv][kind]
        base = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        if namespaced:
            return f"{base}/namespaces/{md.get('namespace') or 'default'}/{plural}/{md['name']}"
        return f"{base}/{plural}/{md['name']}"


def _call(api: client.ApiClient, path: str, method: str, body: dict | None = None, query=None, content_type=None):
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type
    return api.call_api(path, method, query_params=query or [], header_params=headers, body=body,
                        auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True,
                        _request_timeout=REQUEST_TIMEOUT)


def _reason(e: client.ApiException) -> str:
    """The API's own message (a conflict names the fields and their managers)."""
    try:
        message = json.loads(e.body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return f": {message}" if message else ""


def apply(api: client.ApiClient, objects: list[dict], log: Callable[[str], None]) -> list[dict]:
    """Server-side apply each object as field manager `talos`, without forcing; returns what the
    API answered for each."""
    paths = _Paths(api)
    applied = []
    for obj in ordered(objects):
        try:
            path = paths.of(obj)
            live = _call(api, path, "PATCH", obj, [("fieldManager", FIELD_MANAGER), ("force", "false")],
                         "application/apply-patch+yaml")
        except client.ApiException as e:
            hint = (" Another field manager owns fields Talos renders; give them back (or remove that "
                    "manager's fields), then run `pulumi up` again." if e.status == 409 else
                    " Fix the cause, then run `pulumi up` again: the sync is repeated as a whole.")
            raise ManifestSyncError(f"the cluster API refused the bootstrap manifest {describe(obj)} "
                                    f"({describe_error(e)}{_reason(e)}).{hint}") from e
        except ManifestSyncError:
            raise
        except Exception as e:  # noqa: BLE001 - the API's failure, named
            raise ManifestSyncError(f"could not apply the bootstrap manifest {describe(obj)} ({describe_error(e)}). "
                                    "Bring the API back, then run `pulumi up` again.") from e
        applied.append(live)
        log(f"bootstrap manifests: applied {describe(obj)}")
    return applied


def rolled_out(obj: dict) -> str | None:
    """None when a workload has rolled out its current generation; else what is missing."""
    kind, spec, status = obj.get("kind"), obj.get("spec") or {}, obj.get("status") or {}
    generation = (obj.get("metadata") or {}).get("generation")
    if kind not in ("DaemonSet", "Deployment", "StatefulSet"):
        return None
    if generation is not None and (status.get("observedGeneration") or 0) < generation:
        return f"generation {generation} not observed yet (at {status.get('observedGeneration') or 0})"
    if kind == "DaemonSet":
        want = status.get("desiredNumberScheduled") or 0
        updated, available = status.get("updatedNumberScheduled") or 0, status.get("numberAvailable") or 0
        return None if updated >= want and available >= want else \
            f"{updated}/{want} pods updated, {available}/{want} available"
    want = spec.get("replicas", 1)
    updated, ready = status.get("updatedReplicas") or 0, status.get("availableReplicas" if kind == "Deployment" else "readyReplicas") or 0
    total = status.get("replicas") or 0
    return None if updated >= want and ready >= want and total <= want else \
        f"{updated}/{want} replicas updated, {ready}/{want} ready, {total} in all"


def wait_reconciled(api: client.ApiClient, applied: list[dict], *, timeout: float) -> None:
    """Wait (bounded) until every applied workload has rolled out; the error names the ones that did not."""
    workloads = [o for o in applied if o.get("kind") in ("DaemonSet", "Deployment", "StatefulSet")]
    if not workloads:
        return
    paths = _Paths(api)

    def probe(_left: float) -> None:
        behind = []
        for obj in workloads:
            try:
                live = _call(api, paths.of(obj), "GET")
            except Exception as e:  # noqa: BLE001 - an API hiccup under load: tried again within the bound
                behind.append(f"{describe(obj)}: not read ({describe_error(e)})")
                continue
            if (problem := rolled_out(live)) is not None:
                behind.append(f"{describe(obj)}: {problem}")
        if behind:
            raise NotYet("; ".join(behind))

    wait_until("the bootstrap manifests' workloads to roll out", probe, timeout=timeout, bounds=_POLL,
               remedy="Check those workloads' pods (image pulls, scheduling); raise timeouts.kubernetesUpgrade if "
                      "they are only slow, then run `pulumi up` again: the sync is repeated, finished nodes are not.")


def proxy_image(objects: list[dict]) -> str | None:
    """The image of the kube-proxy DaemonSet among the objects (None when there is none)."""
    for o in objects:
        if o.get("kind") == "DaemonSet" and (o.get("metadata") or {}).get("name") == "kube-proxy":
            containers = (((o.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
            return next((c.get("image") for c in containers if c.get("name") == "kube-proxy"), None)
    return None


@dataclass(frozen=True)
class Sync:
    talos: TalosClient  # a control plane that was sent the target config
    api: client.ApiClient
    log: Callable[[str], None]
    timeout: float
    proxy_image: str | None = None  # the target config's cluster.proxy.image, when kube-proxy is enabled


def _read_target(s: Sync) -> list[dict]:
    """The node's manifests once they are rendered from the target config: Talos renders them
    after a config change, so a kube-proxy image other than the target's is waited for (bounded)."""
    def probe(_left: float) -> list[dict]:
        try:
            objects = read(s.talos)
        except ManifestSyncError:
            raise
        except KontinuumError as e:
            raise NotYet(f"the manifests could not be read ({e})") from e
        seen = proxy_image(objects)
        if s.proxy_image and seen != s.proxy_image:
            raise NotYet(f"its kube-proxy manifest has {seen or 'no DaemonSet'}, not {s.proxy_image}")
        return objects

    return wait_until(f"{s.talos.node} to render its bootstrap manifests from the target config", probe,
                      timeout=s.timeout, bounds=_POLL,
                      remedy="Check that node's machine config (cluster.proxy) and its controller-runtime logs, "
                             "then run `pulumi up` again.")


def sync(s: Sync) -> list[str]:
    """Read (from the target config), apply, wait; returns what was applied (kind namespace/name)."""
    objects = _read_target(s)
    s.log(f"bootstrap manifests: {len(objects)} objects from {s.talos.node}")
    applied = apply(s.api, objects, s.log)
    wait_reconciled(s.api, applied, timeout=s.timeout)
    return [describe(o) for o in objects]
