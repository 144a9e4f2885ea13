"""KubernetesVersion: the zone's Kubernetes version, rolled out in upgrade-k8s's order and
recorded (DESIGN §10).

diff is pure: it refuses, at preview, a change upgrade-k8s would refuse (one minor at a time,
never back; a flag, feature gate or admission plugin the target removes, set in our own configs
or patches) and logs the plan, step by step (which node, which components, from → to), before
any node is touched. create/update run the ordered rollout of kontinuum/lifecycle/
kubernetes_upgrade.py (pre-pull of the target images, control planes' static pods one node at
a time, kubelets node by node, then the bootstrap-manifest sync from a control plane's target
config), which reads the truth first, so a killed run resumes without redoing a finished node.
The zone's ConfigApply resources depend on this one and apply the full configs after it. The
state records, per node, the version of each component (output `nodeVersions`). On a new zone
no node runs Kubernetes yet: nothing to roll; a zone adopted without a record is not synced.
delete: nothing.

The rollout and its clients (kubernetes, the Talos client) load where they run: the program only
registers this resource, and a diff only plans (kontinuum/lifecycle/kubernetes_upgrade.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from kontinuum.errors import ConfigError, KontinuumError
from kontinuum.lifecycle import versions
from kontinuum.talos.errors import TalosError, TlsTrustError
from kontinuum.talos.talosconfig import APID_PORT
from providers.common import TypedResource, with_secret_outputs
from providers.talos_common import Inputs, client_cache, cluster_kubeconfig, info, known, node_client

if TYPE_CHECKING:
    from kontinuum.lifecycle.kubernetes_upgrade import Step

RECORDED = ("zone", "version", "configPath")
SECRET_INPUTS = ("configs", "talosconfig")


def _steps(props: dict) -> list[Step] | None:
    """The rollout's steps, or None while a node or config is not known (a first preview)."""
    from kontinuum.lifecycle import kubernetes_upgrade as k8s_upgrade

    nodes, configs = props.get("nodes"), props.get("configs")
    if not known(nodes) or not known(configs) or not isinstance(nodes, list):
        return None
    out = []
    for n in nodes:
        if not isinstance(n, dict) or not all(known(n.get(k)) for k in ("name", "address", "pool")):
            return None
        config = (configs or {}).get(n["pool"])
        if not known(config):
            return None
        out.append(k8s_upgrade.Node(n["name"], n["address"], n.get("role") == "controlplane", config or "", n["pool"]))
    return k8s_upgrade.plan(out)


def diff_kubernetes_version(olds: dict, news: dict) -> DiffResult:
    recorded, target = olds.get("version"), news.get("version")
    if not known(target) or not recorded:
        return DiffResult(changes=True)
    if versions.same(recorded, target):
        return DiffResult(changes=any(olds.get(k) != news.get(k) for k in RECORDED))
    if (problem := versions.kubernetes_skew_problem(recorded, target)):
        raise ConfigError(f"{news.get('configPath') or 'zones[?]'}.kubernetesVersion",
                          f"the zone runs Kubernetes {recorded}: {problem}. Nothing was changed")
    steps = _steps(news)
    if steps is None:
        info(f"Kubernetes upgrade of zone {news.get('zone')}: {recorded} → {target} (nodes known at `up`)")
    else:
        from kontinuum.lifecycle.kubernetes_upgrade import plan_lines

        _refuse_removed(news, steps, recorded, target)
        for line in plan_lines(steps, recorded, target):
            info(line)
    return DiffResult(changes=True)


def _refuse_removed(news: dict, steps: list[Step], recorded: str, target: str) -> None:
    """The pre-flight part a preview can see: what the step removes, set in our own configs
    (their patches included). What the nodes run and the cluster's objects are checked at `up`."""
    from kontinuum.lifecycle.kubernetes_preflight import check_configs

    nodes = list(dict.fromkeys(s.node for s in steps))
    problem = check_configs(recorded, target, {n.pool: n.config for n in nodes},
                            {n.pool for n in nodes if n.control_plane})
    if problem:
        raise ConfigError(f"{news.get('configPath') or 'zones[?]'}.kubernetesVersion", f"{problem}\nNothing was changed")


def _members(props: dict, steps: list[Step], *, new_zone: bool) -> set[str]:
    """Addresses of the nodes that answer with this cluster's identity: the others are not in
    the cluster yet (maintenance mode) and get the target version with their first config. On
    a new zone a node that does not answer is left to its ConfigApply, which reports it."""
    members = set()
    for address in dict.fromkeys(s.node.address for s in steps):
        try:
            node_client(props, address).version(timeout=10.0)
            members.add(address)
        except (TalosError if new_zone else TlsTrustError):
            info(f"{address}: not a member of the cluster yet; its first config carries Kubernetes {props['version']}")
    return members


def _converge(props: dict, olds: dict | None) -> dict:
    steps = _steps(props) or []
    target = props["version"]
    recorded = {**((olds or {}).get("nodeVersions") or {})}
    outs = {**{k: props.get(k) for k in RECORDED}, "nodeVersions": recorded}  # recorded grows below
    if olds and versions.same(olds.get("version") or "", target):
        return outs
    members = _members(props, steps, new_zone=olds is None) if steps else set()
    steps = [s for s in steps if s.node.address in members]
    if not steps:
        return outs
    kubeconfig = cluster_kubeconfig(props, next((s.node.address for s in steps if s.node.control_plane), None))
    if kubeconfig is None:
        raise KontinuumError(f"zone {props.get('zone')}: no control plane handed out the cluster's kubeconfig, so the "
                             f"Kubernetes upgrade to {target} cannot watch its nodes. Bring a control plane back, then "
                             "run `pulumi up` again.")
    client_for = client_cache(props)  # one TLS context per node for the whole step

    from kubernetes import client

    from kontinuum.kube.clients import api_client
    from kontinuum.lifecycle import kubernetes_upgrade as k8s_upgrade

    api = api_client(kubeconfig)
    try:
        ctx = k8s_upgrade.Context(client_for=client_for, core=client.CoreV1Api(api), log=info,
                                  timeout=float(props["timeout"]), settle_unready=olds is not None,
                                  sync_manifests=olds is not None)
        recorded.update(k8s_upgrade.rollout(ctx, steps, target, current=(olds or {}).get("version")))
    finally:
        api.close()
    return outs


class KubernetesVersionProvider(ResourceProvider):
    def check(self, olds, news):
        inputs = Inputs(news)
        inputs.string("version", "the zone's Kubernetes version")
        if news.get("talosconfig") is not None:
            inputs.talosconfig()
        inputs.port()
        inputs.seconds("timeout", 300.0)
        return inputs.result()

    def diff(self, _id, olds, news):
        return diff_kubernetes_version(olds, news)

    def create(self, props):
        return CreateResult(id_=props.get("zone") or "kubernetes", outs=_converge(props, None))

    def update(self, _id, olds, news):
        return UpdateResult(outs=_converge(news, olds))


class KubernetesVersion(TypedResource, module="talos", name="KubernetesVersion"):
    """The zone's Kubernetes version. Outputs: `version` (what the zone runs after the last
    rollout) and `nodeVersions` (node → component → version)."""

    version: pulumi.Output[str]

    def __init__(self, resource_name: str, *, zone: str, version: str, config_path: str,
                 nodes: pulumi.Input[list] | None = None, configs: pulumi.Input[dict] | None = None,
                 talosconfig: pulumi.Input[str] | None = None, talos_port: pulumi.Input[int] = APID_PORT,
                 timeout: float = 300.0, opts: pulumi.ResourceOptions | None = None):
        """nodes: the zone's members in order ({name, address, role, pool}: control planes first);
        configs: each pool's rendered machine config (secret)."""
        props = {"zone": zone, "version": version, "configPath": config_path, "nodes": nodes or [],
                 "configs": pulumi.Output.secret(configs) if configs is not None else {},
                 "talosconfig": pulumi.Output.secret(talosconfig) if talosconfig is not None else None,
                 "talosPort": talos_port, "timeout": timeout}
        super().__init__(KubernetesVersionProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_INPUTS))
