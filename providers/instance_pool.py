"""InstancePool: compare-and-swap claims of Instances matching a selector.

create/update claim up to `replicas` (sticky; members keep their slot, a scale-down
releases the last slots), delete releases. check/diff are pure. A changed selector or pool name replaces the pool, deleting
(releasing) first: the claim label is the pool's identity, so both must never coexist.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, Resource, ResourceProvider, UpdateResult

from providers.common import diff_inputs, with_secret_outputs

REPLACE_ON = ("pool", "selector")
UPDATE_ON = ("replicas", "waitSeconds", "hubKubeconfig")


def _inventory(hub_kubeconfig: str):
    """The hub's Instances. Imported here: the program registering this resource never needs
    the kubernetes client, only the provider process does."""
    from kontinuum.hub.inventory import Inventory

    return Inventory.from_kubeconfig(hub_kubeconfig)


def check_pool(news: dict) -> list[CheckFailure]:
    failures = []
    pool = news.get("pool") or ""
    if not pool or len(pool) > 63:
        failures.append(CheckFailure("pool", "required, at most 63 characters (it is a label value)"))
    if not isinstance(news.get("selector"), dict) or not news["selector"]:
        failures.append(CheckFailure("selector", "must be a non-empty map of labels"))
    replicas = news.get("replicas")
    if not isinstance(replicas, (int, float)) or int(replicas) != replicas or replicas < 0:
        failures.append(CheckFailure("replicas", f"must be a whole number >= 0, got {replicas!r}"))
    if not news.get("hubKubeconfig"):
        failures.append(CheckFailure("hubKubeconfig", "required: the hub's kubeconfig (secret)"))
    return failures


class InstancePoolProvider(ResourceProvider):
    def check(self, _olds, news):
        return CheckResult(news, check_pool(news))

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, replace_on=REPLACE_ON, update_on=UPDATE_ON)

    def _claim(self, props: dict, previous: list[dict] | None = None) -> dict:
        inv = _inventory(props["hubKubeconfig"])
        state = inv.claim(props["pool"], props["selector"], int(props["replicas"]),
                          wait=float(props.get("waitSeconds") or 0), order=[m["name"] for m in previous or []])
        members = [{"name": m.name, "address": m.address, "discovered": m.discovered} for m in state.members]
        return {**props, "members": members, "readyReplicas": state.ready_replicas, "released": state.released}

    def create(self, props):
        return CreateResult(id_=props["pool"], outs=self._claim(props))

    def update(self, _id, olds, news):
        # Members keep their slot across updates: the component applies config per slot.
        return UpdateResult(outs=self._claim(news, olds.get("members")))

    def delete(self, id_, props):
        _inventory(props["hubKubeconfig"]).release(id_)


class InstancePool(Resource):
    """Outputs: members [{name, address, discovered}], readyReplicas, released."""

    members: pulumi.Output[list]
    readyReplicas: pulumi.Output[int]

    def __init__(
        self,
        resource_name: str,
        *,
        pool: pulumi.Input[str],
        selector: pulumi.Input[dict],
        replicas: pulumi.Input[int],
        hub_kubeconfig: pulumi.Input[str],
        wait_seconds: float = 0.0,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "pool": pool,
            "selector": selector,
            "replicas": replicas,
            "hubKubeconfig": pulumi.Output.secret(hub_kubeconfig),
            "waitSeconds": wait_seconds,
            "members": None,
            "readyReplicas": None,
            "released": None,
        }
        super().__init__(InstancePoolProvider(), resource_name, props, with_secret_outputs(opts, "hubKubeconfig"))
