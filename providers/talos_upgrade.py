"""TalosUpgrade: one machine's Talos version, kept at the zone's talosVersion (DESIGN §10).

One resource per machine, named after its Instance; the zone chains them (each depends on the
previous one: control planes first, then each worker pool), so Pulumi walks them one at a
time and a failed node stops the chain there. The state records per node the version it runs
(output `version`): `pulumi preview --diff` shows each node's `version` from → to in chain
order, and the diff logs the plan line.
check/diff are pure; diff refuses, at preview, an upgrade the version policy forbids (it sees
the recorded version). create/update: kontinuum/lifecycle/talos_upgrade.py, which reads the
node's running version first, so a killed run resumes without upgrading a node twice.
delete: nothing (the machine leaves through its ConfigApply).
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from kontinuum.errors import ConfigError
from kontinuum.lifecycle import versions
from kontinuum.talos.talosconfig import APID_PORT
from providers.common import TypedResource, with_secret_outputs
from providers.config_apply import ROLES
from providers.talos_common import Inputs, client_cache, info, known, kubeconfig_getter

SECRET_OUTPUTS = ("talosconfig",)
DRAIN_TIMEOUT = 300.0
RECORDED = ("instance", "address", "role", "pool", "talosVersion", "installerImage", "controlPlanes", "drain",
            "allowDowngrade", "timeout", "healthTimeout", "talosPort", "configPath", "step", "talosconfig")


def check_talos_upgrade(news: dict) -> Inputs:
    inputs = Inputs(news)
    inputs.string("address", "the node's address")
    inputs.string("role", "the node's role", choices=ROLES)
    inputs.string("talosVersion", "the target Talos version")
    inputs.string("installerImage", "the installer image of the target version")
    inputs.strings("controlPlanes", "control-plane addresses")
    inputs.talosconfig()
    inputs.port()
    inputs.seconds("timeout", 900.0)
    inputs.seconds("healthTimeout", 300.0)
    inputs.flag("drain", True)
    inputs.flag("allowDowngrade", False)
    target = inputs.news.get("talosVersion")
    if known(target) and isinstance(target, str) and target:
        try:
            versions.parse(target)
        except ValueError as e:
            inputs.fail("talosVersion", str(e))
    return inputs


def plan_line(olds: dict, news: dict) -> str:
    return (f"Talos upgrade, step {news.get('step')}: {news.get('instance')} ({news.get('address')}) "
            f"{olds.get('version')} → {news.get('talosVersion')}")


def diff_talos_upgrade(olds: dict, news: dict) -> DiffResult:
    """olds: the recorded outputs, whose `version` is what the node ran after our last step."""
    recorded, target = olds.get("version"), news.get("talosVersion")
    if not known(target):
        return DiffResult(changes=True)
    if recorded and not versions.same(recorded, target):
        problem = versions.upgrade_problem(recorded, target, allow_downgrade=bool(news.get("allowDowngrade")))
        if problem:
            path = news.get("configPath") or "talosVersion"
            raise ConfigError(f"{path}.talosVersion", f"{news.get('instance')} ({news.get('address')}) runs "
                              f"{recorded}: {problem}. Nothing was changed")
        info(plan_line(olds, news))
        return DiffResult(changes=True)
    settings = [k for k in RECORDED if k not in ("talosVersion", "step") and olds.get(k) != news.get(k)]
    return DiffResult(changes=bool(settings))


def _converge(props: dict) -> dict:
    from kontinuum.lifecycle import talos_upgrade  # the upgrade's clients load where it runs, not in the program

    node = talos_upgrade.NodeUpgrade(
        address=props["address"], name=props.get("instance") or props["address"],
        control_plane=props["role"] == "controlplane", target=props["talosVersion"], image=props["installerImage"],
        control_planes=tuple(props["controlPlanes"]), drain=bool(props["drain"]),
        allow_downgrade=bool(props["allowDowngrade"]), timeout=float(props["timeout"]),
        health_timeout=float(props["healthTimeout"]), drain_timeout=min(DRAIN_TIMEOUT, float(props["timeout"]) / 2))
    client_for = client_cache(props)  # one TLS context per node for the whole step

    ctx = talos_upgrade.Context(
        client_for=client_for,
        kubeconfig=kubeconfig_getter(props),
        log=info)
    version = talos_upgrade.upgrade_node(ctx, node)
    return {**{k: props.get(k) for k in RECORDED}, "version": version}


class TalosUpgradeProvider(ResourceProvider):
    def check(self, olds, news):
        return check_talos_upgrade(news).result()

    def diff(self, _id, olds, news):
        return diff_talos_upgrade(olds, news)

    def create(self, props):
        return CreateResult(id_=props.get("instance") or props["address"], outs=_converge(props))

    def update(self, _id, olds, news):
        return UpdateResult(outs=_converge(news))

    def delete(self, _id, props):
        pass  # the machine's version is its own; leaving the zone is ConfigApply's delete


class TalosUpgrade(TypedResource, module="talos", name="TalosUpgrade"):
    """Keeps one machine on the zone's Talos version. Output `version`: what it runs."""

    version: pulumi.Output[str]

    def __init__(self, resource_name: str, *, instance: str, address: pulumi.Input[str], role: str, pool: str,
                 talos_version: str, installer_image: str, control_planes: pulumi.Input[list[str]],
                 talosconfig: pulumi.Input[str], drain: bool, allow_downgrade: bool, timeout: float,
                 health_timeout: float, config_path: str, step: str, talos_port: pulumi.Input[int] = APID_PORT,
                 opts: pulumi.ResourceOptions | None = None):
        props = {
            "instance": instance, "address": address, "role": role, "pool": pool,
            "talosVersion": talos_version, "installerImage": installer_image,
            "controlPlanes": control_planes, "talosconfig": pulumi.Output.secret(talosconfig),
            "drain": drain, "allowDowngrade": allow_downgrade, "timeout": timeout, "healthTimeout": health_timeout,
            "talosPort": talos_port, "configPath": config_path, "step": step, "version": None,
        }
        super().__init__(TalosUpgradeProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_OUTPUTS))
