"""ConfigRollout: a zone's config change rolled by what it does (kontinuum/lifecycle/config_rollout.py).

One resource per zone, before every ConfigApply: when a pool's rendered config changes, each
configured member is asked by a dry run; the reboots run here, paced by the readiness gate,
and every ConfigApply then sends its config in no-reboot mode (live changes: all at once).
check asks the nodes when a config changed and all is known, so the preview shows the plan
(`plan`: which nodes reboot, in which order); the update asks again (the truth at that
moment) and rolls. create records only: the machines are still in maintenance mode and each
ConfigApply installs its config. delete: nothing.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from kontinuum.talos.errors import TalosError
from kontinuum.talos.talosconfig import APID_PORT
from providers.common import TypedResource, with_secret_outputs
from providers.config_apply import ROLES
from providers.talos_common import Inputs, client_cache, config_hash, info, known, kubeconfig_getter

SECRET_OUTPUTS = ("talosconfig",)
ASK_TIMEOUT = 10.0  # each node's dry run
DRAIN_TIMEOUT = 300.0
UNKNOWN = "unknown until apply"


def _hashes(configs: dict) -> dict:
    return {pool: config_hash(text) for pool, text in sorted((configs or {}).items())}


def _changed(olds: dict, news: dict) -> bool:
    """A pool's config differs from the one recorded (olds: inputs at check, outputs at diff)."""
    recorded = olds.get("configHashes") or _hashes(olds.get("configs") or {})
    configs = news.get("configs")
    if not known(configs) or any(not known(v) for v in (configs or {}).values()):
        return True
    return recorded != _hashes(configs)


def check_config_rollout(olds: dict, news: dict) -> Inputs:
    inputs = Inputs(news)
    inputs.string("zone", "the zone's name")
    inputs.talosconfig()
    inputs.port()
    inputs.seconds("timeout", 900.0)
    inputs.seconds("healthTimeout", 300.0)
    inputs.flag("drain", True)
    inputs.flag("drainControlPlanes", False)
    n = inputs.news.get("maxUnavailable")
    if known(n) and (not isinstance(n, (int, float)) or n < 1 or int(n) != n):
        inputs.fail("maxUnavailable", f"must be a whole number of nodes, at least 1 (got {n!r})")
    elif known(n):
        inputs.news["maxUnavailable"] = int(n)
    for i, node in enumerate(inputs.news.get("nodes") or []):
        if known(node) and isinstance(node, dict) and node.get("role") not in ROLES:
            inputs.fail(f"nodes[{i}].role", f"must be one of {', '.join(ROLES)}")
    if olds and not inputs.failures:
        inputs.news["plan"] = preview_plan(olds, inputs.news) if _changed(olds, inputs.news) else []
    return inputs


def _context(props: dict):
    from kontinuum.lifecycle import config_rollout, readiness  # the clients load where they run

    nodes = [config_rollout.Node(n["name"], n["address"], n["role"], n["pool"]) for n in props["nodes"]]
    client_for = client_cache(props)  # one TLS context per node for the whole step

    cps = tuple(n.address for n in nodes if n.control_plane)
    gate = readiness.Gate(client_for=client_for, kubeconfig=kubeconfig_getter(props), control_planes=cps)
    return nodes, gate


def preview_plan(olds: dict, news: dict) -> list[str]:
    """Which nodes a `pulumi up` would reboot, in order, by asking each node now; "unknown
    until apply" with the reason when the plan cannot know."""
    from kontinuum.lifecycle import config_rollout

    configs = news.get("configs")
    unknown = [f"the machine config of pool {pool}" for pool, v in (configs.items() if isinstance(configs, dict) else ())
               if not known(v)] + [f"input {k}" for k in ("configs", "nodes", "talosconfig", "maxUnavailable")
                                   if not known(news.get(k))]
    if unknown:
        return [f"{UNKNOWN}: {', '.join(unknown)} (computed in the up, e.g. from a secrets bundle that changes)"]
    nodes, gate = _context(news)
    try:
        steps = config_rollout.plan(gate, nodes, news["configs"], ASK_TIMEOUT)
    except (config_rollout.NodeUnansweredError, TalosError) as e:
        return [f"{UNKNOWN}: {e}"]
    return config_rollout.describe(steps, int(news["maxUnavailable"]))


def diff_config_rollout(olds: dict, news: dict) -> DiffResult:
    return DiffResult(changes=_changed(olds, news))


def outputs(props: dict, plan: list[str]) -> dict:
    recorded = {k: props.get(k) for k in ("zone", "nodes", "talosconfig", "talosPort", "maxUnavailable", "drain",
                                          "drainControlPlanes", "timeout", "healthTimeout")}
    return {**recorded, "configHashes": _hashes(props["configs"]), "plan": plan}


def roll(props: dict) -> dict:
    from kontinuum.lifecycle import config_rollout

    nodes, gate = _context(props)
    steps = config_rollout.plan(gate, nodes, props["configs"], ASK_TIMEOUT)
    plan = config_rollout.describe(steps, int(props["maxUnavailable"]))
    info(f"ConfigRollout {props['zone']}: " + "; ".join(plan))
    settings = config_rollout.Settings(
        max_unavailable=int(props["maxUnavailable"]), drain=bool(props["drain"]),
        drain_control_planes=bool(props["drainControlPlanes"]), timeout=float(props["timeout"]),
        health_timeout=float(props["healthTimeout"]), drain_timeout=min(DRAIN_TIMEOUT, float(props["timeout"]) / 2))
    config_rollout.roll(config_rollout.Context(gate=gate, log=info), settings, steps, props["configs"])
    return outputs(props, plan)


class ConfigRolloutProvider(ResourceProvider):
    def check(self, olds, news):
        return check_config_rollout(olds, news).result()

    def diff(self, _id, olds, news):
        return diff_config_rollout(olds, news)

    def create(self, props):
        return CreateResult(id_=props["zone"], outs=outputs(props, []))

    def update(self, _id, olds, news):
        return UpdateResult(outs=roll(news))

    def delete(self, _id, props):
        pass


class ConfigRollout(TypedResource, module="talos", name="ConfigRollout"):
    """Rolls a zone's config changes that need a reboot, paced by readiness. Output `plan`:
    which nodes its last update rebooted, in order (at preview: which it will)."""

    plan: pulumi.Output[list]

    def __init__(self, resource_name: str, *, zone: str, nodes: pulumi.Input[list], configs: pulumi.Input[dict],
                 talosconfig: pulumi.Input[str], max_unavailable: int, drain: bool, drain_control_planes: bool,
                 timeout: float, health_timeout: float, talos_port: pulumi.Input[int] = APID_PORT,
                 opts: pulumi.ResourceOptions | None = None):
        props = {
            "zone": zone, "nodes": nodes, "configs": pulumi.Output.secret(configs),
            "talosconfig": pulumi.Output.secret(talosconfig), "talosPort": talos_port,
            "maxUnavailable": max_unavailable, "drain": drain, "drainControlPlanes": drain_control_planes,
            "timeout": timeout, "healthTimeout": health_timeout, "plan": None, "configHashes": None,
        }
        super().__init__(ConfigRolloutProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))
