"""InstancePool: compare-and-swap claims of Instances on the hub.

Two ways to say who the members are. With `machines` (name → interfaces, as a zone's
TalosCluster uses it) the members are exactly those Instances: membership by identity, known
to the program and so to a preview. Without, the pool claims any `replicas` Instances
matching the selector (sticky; a scale-down releases the most recently claimed). delete
releases. check/diff are pure. A changed selector or pool name replaces the pool, deleting
(releasing) first: the claim label is the pool's identity, so both must never coexist.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs, why_not_read, with_secret_outputs

REPLACE_ON = ("pool", "selector")
UPDATE_ON = ("replicas", "machines", "waitSeconds", "hubKubeconfig")


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
    machines = news.get("machines")
    if machines is not None and (not isinstance(machines, dict) or len(machines) != replicas):
        failures.append(CheckFailure("machines", "must map each of `replicas` member names to its interfaces"))
    return failures


def check_keeps_a_member(olds: dict, news: dict) -> list[CheckFailure]:
    """A control-plane pool may not swap all its members in one step: the last one holds etcd,
    and a zone whose etcd leaves with it is lost. Pure: compares the old and new member names."""
    before, after = set(olds.get("machines") or {}), set(news.get("machines") or {})
    if not news.get("keepOneMember") or not before or not after or before & after:
        return []
    return [CheckFailure("machines", (
        f"pool {news.get('pool')}: every member would change at once ({', '.join(sorted(before))} leave, "
        f"{', '.join(sorted(after))} join), and the last one to leave takes the cluster's etcd with it. Add the new "
        "machine first (list it and raise replicas, or keep one old member), run `pulumi up`, then remove the old one."))]


class InstancePoolProvider(ResourceProvider):
    def check(self, olds, news):
        return CheckResult(news, check_pool(news) + check_keeps_a_member(olds or {}, news))

    def diff(self, _id, olds, news):
        result = diff_inputs(olds, news, replace_on=REPLACE_ON, update_on=UPDATE_ON)
        members, replicas = olds.get("members"), news.get("replicas")
        if isinstance(members, list) and isinstance(replicas, (int, float)) and len(members) < replicas:
            result.changes = True  # a refresh found claims lost behind our back: claim again
        return result

    def _claim(self, props: dict, previous: list[dict] | None = None) -> dict:
        inv = _inventory(props["hubKubeconfig"])
        wait = float(props.get("waitSeconds") or 0)
        if props.get("machines") is not None:
            state = inv.claim_named(props["pool"], props["machines"], props["selector"], wait=wait)
        else:
            state = inv.claim(props["pool"], props["selector"], int(props["replicas"]), wait=wait,
                              order=[m["name"] for m in previous or []])
        members = [{"name": m.name, "address": m.address, "discovered": m.discovered} for m in state.members]
        return {**props, "members": members, "readyReplicas": state.ready_replicas, "released": state.released}

    def create(self, props):
        return CreateResult(id_=props["pool"], outs=self._claim(props))

    def update(self, _id, olds, news):
        # Members keep their slot across updates: the component applies config per slot.
        return UpdateResult(outs=self._claim(news, olds.get("members")))

    def read(self, id_, props):
        """Refresh: the Instances that still carry this pool's claim. A hub that does not answer
        keeps the record (reported); lost claims show as fewer members and the next up claims again."""

        try:
            held = _inventory(props["hubKubeconfig"]).members(id_)
        except Exception as exc:  # noqa: BLE001 - any failure to read is reported, never fatal
            _warn(f"InstancePool {id_}: claims not read ({why_not_read(exc)}); kept as recorded")
            return ReadResult(id_=id_, outs=props)
        names = {m.name for m in held}
        lost = sorted({m["name"] for m in props.get("members") or []} - names)
        if not lost:
            return ReadResult(id_=id_, outs=props)  # nothing wrong: the record stays as it is
        _warn(f"InstancePool {id_}: drift: claims no longer held: {', '.join(lost)}; the next up claims again")
        members = [m for m in props.get("members") or [] if m["name"] in names]
        return ReadResult(id_=id_, outs={**props, "members": members,
                                         "readyReplicas": sum(1 for m in members if m.get("discovered"))})

    def delete(self, id_, props):
        _inventory(props["hubKubeconfig"]).release(id_)


def _warn(message: str) -> None:
    from providers.talos_common import warn

    warn(message)


class InstancePool(TypedResource, module="hub", name="InstancePool"):
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
        machines: dict[str, list[str]] | None = None,
        keep_one_member: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """machines: the members by name (→ interfaces), instead of any `replicas` matching the
        selector. keep_one_member: refuse (at check, so in preview) to replace every member at once."""
        props = {
            "pool": pool,
            "selector": selector,
            "replicas": len(machines) if machines is not None else replicas,
            "machines": machines,
            "keepOneMember": keep_one_member,
            "hubKubeconfig": pulumi.Output.secret(hub_kubeconfig),
            "waitSeconds": wait_seconds,
            "members": None,
            "readyReplicas": None,
            "released": None,
        }
        super().__init__(InstancePoolProvider(), resource_name, props, with_secret_outputs(opts, "hubKubeconfig"))
