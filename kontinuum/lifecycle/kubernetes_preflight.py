"""talosctl upgrade-k8s's pre-flight checks, done by us before a Kubernetes upgrade changes
anything (reference/failure-facts.md §4; the facts: kubernetes_removed.py).

For a minor step (X.Y → X.Y+1) the upgrade is refused when something the target no longer has
is still in use:
- in what the nodes run now: each control plane's static pods (COSI `StaticPods`, namespace k8s,
  the first container's command) and every node's kubelet (`KubeletSpecs` id kubelet, args);
- in our own rendered configs (their patches included): the extraArgs of cluster.apiServer,
  cluster.controllerManager, cluster.scheduler and machine.kubelet. These are known at preview,
  so the preview refuses too (providers/kubernetes_version.py);
- removed API resources that still have objects: a list per resource; NotFound means the
  cluster does not serve it, which is fine.

Matching is upstream's: a flag is an arg whose key before `=` is `--<flag>`; feature gates are
the names before `=` in `--feature-gates=` (static pods only); admission plugins are the items
of `--enable-admission-plugins=` (kube-apiserver only). Upstream reads only the first
`--feature-gates`/`--enable-admission-plugins` arg; we read each of them, which can only find more.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterable

import yaml
from kubernetes import client

from kontinuum.errors import KontinuumError
from kontinuum.kube.clients import describe_error
from kontinuum.talos.errors import TalosError
from kontinuum.lifecycle.kubernetes_removed import (APISERVER, CONTROLLER_MANAGER, KUBELET, SCHEDULER, STATIC_PODS,
                                                    Removed, removed_for)

NAMESPACE = "k8s"
STATIC_POD = "StaticPods.kubernetes.talos.dev"
KUBELET_SPEC = "KubeletSpecs.kubernetes.talos.dev"
REQUEST_TIMEOUT = 10.0
FLAG, GATE, PLUGIN = "flag", "feature gate", "admission plugin"
EXTRA_ARGS = {
    APISERVER: ("cluster", "apiServer", "extraArgs"),
    CONTROLLER_MANAGER: ("cluster", "controllerManager", "extraArgs"),
    SCHEDULER: ("cluster", "scheduler", "extraArgs"),
    KUBELET: ("machine", "kubelet", "extraArgs"),
}


class PreflightError(KontinuumError):
    """The upgrade would remove something still in use; nothing was changed."""


@dataclass(frozen=True)
class Hit:
    where: str  # the node (name and address), or the pool whose config it is
    component: str
    kind: str  # FLAG, GATE or PLUGIN
    value: str
    source: str  # what was read: "running", or the config field


# --- matching (pure) ----------------------------------------------------------------------------


def _values(args: Iterable[str], flag: str) -> list[str]:
    """The comma-separated items of every `--<flag>=` arg."""
    prefix = f"--{flag}="
    return [item.strip() for a in args if a.startswith(prefix) for item in a[len(prefix):].split(",") if item.strip()]


def arg_hits(component: str, args: Iterable[str], removed: Removed) -> list[tuple[str, str]]:
    """(kind, name) of each removed flag, feature gate or admission plugin in `args`."""
    args = [str(a) for a in args]
    keys = {a.split("=", 1)[0] for a in args}
    hits = [(FLAG, f) for f in removed.flags.get(component, ()) if f"--{f}" in keys]
    if component in STATIC_PODS:
        gates = {g.split("=", 1)[0].strip() for g in _values(args, "feature-gates")}
        hits += [(GATE, g) for g in removed.feature_gates if g in gates]
    if component == APISERVER:
        plugins = set(_values(args, "enable-admission-plugins"))
        hits += [(PLUGIN, p) for p in removed.admission_plugins if p in plugins]
    return hits


def _v1alpha1(config: str) -> dict:
    for doc in yaml.safe_load_all(config):
        if isinstance(doc, dict) and doc.get("version") == "v1alpha1" and "kind" not in doc:
            return doc
    return {}


def config_args(config: str) -> dict[str, list[str]]:
    """component → the args its extraArgs add (`--key=value`, one per value: a value may be a
    string or a list of strings in Talos 1.13)."""
    doc = _v1alpha1(config)
    out: dict[str, list[str]] = {}
    for component, path in EXTRA_ARGS.items():
        extra: object = doc
        for key in path:
            extra = extra.get(key) if isinstance(extra, dict) else None
        if isinstance(extra, dict) and extra:
            values = {k: v if isinstance(v, list) else [v] for k, v in extra.items()}
            out[component] = [f"--{k}={'' if v is None else v}" for k, vs in values.items() for v in vs]
    return out


def config_hits(removed: Removed, configs: dict[str, str], control_planes: set[str]) -> list[Hit]:
    """Hits in our rendered configs (pool → config); static pods only in control-plane pools."""
    hits = []
    for pool, text in configs.items():
        for component, args in config_args(text).items():
            if component in STATIC_PODS and pool not in control_planes:
                continue
            field = ".".join(EXTRA_ARGS[component])
            hits += [Hit(f"pool {pool}", component, kind, value, field)
                     for kind, value in arg_hits(component, args, removed)]
    return hits


# --- what the nodes run (Talos COSI) --------------------------------------------------------------


def _command(spec: object) -> list[str]:
    """The first container's command of a StaticPod spec (Talos serves the Pod as its spec)."""
    containers = ((spec or {}).get("spec") or {}).get("containers") if isinstance(spec, dict) else None
    return [str(a) for a in ((containers or [{}])[0].get("command") or [])]


def running_hits(removed: Removed, nodes: Iterable[tuple[str, bool, Callable]]) -> list[Hit]:
    """Hits in what each node runs: (node label, control plane?, read(type, id) → spec or None)."""
    hits = []
    for label, control_plane, read in nodes:
        for component in STATIC_PODS if control_plane else ():
            spec = read(STATIC_POD, component)
            if spec is not None:
                hits += [Hit(label, component, kind, value, "running")
                         for kind, value in arg_hits(component, _command(spec), removed)]
        spec = read(KUBELET_SPEC, KUBELET)
        if isinstance(spec, dict):
            hits += [Hit(label, KUBELET, kind, value, "running")
                     for kind, value in arg_hits(KUBELET, spec.get("args") or [], removed)]
    return hits


# --- removed APIs (the cluster) -------------------------------------------------------------------


def _path(resource: str) -> str:
    """`<resource>.<version>.<group>` → its list path (the core group has no dot after the version)."""
    name, version, *group = resource.split(".")
    return f"/apis/{'.'.join(group)}/{version}/{name}" if group else f"/api/{version}/{name}"


def api_counts(api: client.ApiClient, resources: Iterable[str]) -> dict[str, int]:
    """resource → how many objects it still has (those with none are left out)."""
    counts = {}
    for resource in resources:
        try:
            got = api.call_api(_path(resource), "GET", header_params={"Accept": "application/json"},
                               auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True,
                               _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as e:
            if e.status == 404:
                continue
            raise
        items = (got if isinstance(got, dict) else json.loads(got or "{}")).get("items") or []
        if items:
            counts[resource] = len(items)
    return counts


# --- the verdict -------------------------------------------------------------------------------------


def _line(h: Hit, target: str) -> str:
    if h.source == "running":
        fix = (f"it still runs with it: apply a config without it at the current version first (`pulumi up`), "
               f"then upgrade to {target}")
    else:
        fix = (f"our config sets it ({h.source}, from the zone's or the pool's patches): remove it, apply that at "
               f"the current version (`pulumi up`), then upgrade to {target}")
    return f"  {h.where}: {h.component} {h.kind} {h.value} is removed in {target}; {fix}"


def refusal(current: str, target: str, hits: list[Hit], counts: dict[str, int] | None = None) -> str | None:
    """The message refusing the upgrade, None when nothing is in the way."""
    lines = [_line(h, target) for h in dict.fromkeys(hits)]
    lines += [f"  removed API {r}: {n} object(s) still stored; migrate them to a served version (or delete "
              f"them), then upgrade to {target}" for r, n in sorted((counts or {}).items())]
    if not lines:
        return None
    return (f"the Kubernetes upgrade {current} → {target} was refused before any node changed; still in use:\n"
            + "\n".join(lines))


def check_configs(current: str, target: str, configs: dict[str, str], control_planes: set[str]) -> str | None:
    """The part known at preview: our own rendered configs. The refusal, or None."""
    removed = removed_for(current, target)
    return refusal(current, target, config_hits(removed, configs, control_planes)) if removed else None


@dataclass(frozen=True)
class Member:
    name: str
    address: str
    control_plane: bool
    pool: str
    config: str  # the pool's rendered target config


def check_zone(current: str, target: str, members: list[Member], client_for: Callable, api: client.ApiClient | None) -> None:
    """check() for a zone's members, reading each node's COSI resources through its Talos client."""
    def reader(m: Member):
        def read(rtype: str, rid: str):
            try:
                return client_for(m.address).resource(NAMESPACE, rtype, rid)
            except TalosError as e:
                raise PreflightError(f"could not read {rtype} {rid} of {m.name} ({m.address}) for the pre-flight checks "
                                     f"({e}); nothing was changed. Bring the node back, then run `pulumi up` again.") from e
        return read

    check(current, target, configs={m.pool: m.config for m in members},
          control_planes={m.pool for m in members if m.control_plane},
          nodes=[(f"{m.name} ({m.address})", m.control_plane, reader(m)) for m in members], api=api)


def check(current: str, target: str, *, configs: dict[str, str], control_planes: set[str],
          nodes: Iterable[tuple[str, bool, Callable]], api: client.ApiClient | None) -> None:
    """Every check of the step, before anything changes; raises PreflightError naming each hit."""
    removed = removed_for(current, target)
    if removed is None:
        return
    hits = config_hits(removed, configs, control_planes) + running_hits(removed, nodes)
    try:
        counts = api_counts(api, removed.api_resources) if api is not None else {}
    except Exception as e:  # noqa: BLE001 - the API's failure, named
        raise PreflightError(f"could not list the API resources {target} removes ({describe_error(e)}); nothing was "
                             "changed. Bring the cluster API back, then run `pulumi up` again.") from e
    if (message := refusal(current, target, hits, counts)):
        raise PreflightError(message)
