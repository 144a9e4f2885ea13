"""RegistryJoin: a wait resource whose create blocks (bounded) until the zone's kontinuum-server
heartbeats into the hub registry (seeds, "Registry join"; DESIGN §4 ──► zone Ready).

check/diff are pure, so `pulumi preview` contacts neither the hub nor the zone. `trigger`
ties the wait to the downstream footprint: when the footprint (image, env, identity) changes,
the next `pulumi up` waits again, for the new revision to roll out and then heartbeat (an old
heartbeat, or the replaced pods', never counts). Delete does nothing: the Kontinuum object is the server's
own registration, not ours.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, cluster_wait_failures, diff_inputs, why_not_read, with_secret_outputs

UPDATE_ON = ("region", "zone", "trigger", "maxHeartbeatAge", "hubKubeconfig", "zoneKubeconfig")
SECRET_INPUTS = ("hubKubeconfig", "zoneKubeconfig")
FRESH = 300.0  # seconds: on refresh, an older heartbeat (without maxHeartbeatAge) is drift
READ_TIMEOUT = 10.0


def check_registry_join(news: dict) -> list[CheckFailure]:
    return cluster_wait_failures(news, "region", "zone", kubeconfig="hubKubeconfig", whose="the hub's")


class RegistryJoinProvider(ResourceProvider):
    """Stateless: hub and zone credentials arrive as secret inputs."""

    def check(self, _olds, news):
        return CheckResult(news, check_registry_join(news))

    def diff(self, _id, olds, news):
        result = diff_inputs(olds, news, update_on=UPDATE_ON)
        if olds.get("joined") is False:
            result.changes = True  # a refresh found the heartbeat stale: wait for it again
        return result

    def _wait(self, props: dict, *, after_rollout: bool) -> dict:
        from kontinuum.hub.registry import wait_joined  # only where a wait runs (kubernetes client)

        max_age = props.get("maxHeartbeatAge")
        joined = wait_joined(props["hubKubeconfig"], props["region"], props["zone"], timeout=float(props["timeout"]),
                             max_age=float(max_age) if max_age else None,
                             zone_kubeconfig=props.get("zoneKubeconfig") or None,
                             fresh=True, after_rollout=after_rollout)
        return {**props, "joined": True, "heartbeat": joined.heartbeat, "kontinuum": joined.name,
                "endpoint": joined.endpoint}

    def create(self, props):
        # A heartbeat from before this wait is a registration left from an earlier life of the zone.
        return CreateResult(id_=f"{props['region']}-{props['zone']}", outs=self._wait(props, after_rollout=False))

    def update(self, _id, _olds, news):
        # The footprint changed: the old pods heartbeat until replaced; only the new revision counts.
        # (With no new revision, e.g. after a stale heartbeat, the rollout is done and a fresh beat counts.)
        return UpdateResult(outs=self._wait(news, after_rollout=True))

    def read(self, id_, props):
        """Refresh: is the zone's heartbeat still fresh (maxHeartbeatAge, else FRESH seconds, by
        the hub's clock)? A stale one is drift (joined: false; the next up waits for it again);
        a hub that does not answer keeps the record and is reported."""
        from kontinuum.hub.registry import Registry, find_joined
        from providers.talos_common import warn

        try:
            registry = Registry.from_kubeconfig(props["hubKubeconfig"], timeout=READ_TIMEOUT)
            try:
                items, now = registry.list_at()
            finally:
                registry.close()
        except Exception as exc:  # noqa: BLE001 - any failure to read is reported, never fatal
            warn(f"RegistryJoin {id_}: the hub registry was not read ({why_not_read(exc)}); kept as recorded")
            return ReadResult(id_=id_, outs=props)
        max_age = float(props.get("maxHeartbeatAge") or FRESH)
        joined, seen = find_joined(items, props["region"], props["zone"], now=now, max_age=max_age)
        if joined is None:
            warn(f"RegistryJoin {id_}: drift: {seen}")
            return ReadResult(id_=id_, outs={**props, "joined": False})
        return ReadResult(id_=id_, outs=props)  # fresh: the recorded join stands (no noise in drift checks)


class RegistryJoin(TypedResource, module="hub", name="RegistryJoin"):
    """Outputs: joined (true), heartbeat (RFC 3339, the one observed at join), kontinuum (its name), endpoint."""

    joined: pulumi.Output[bool]
    heartbeat: pulumi.Output[str]
    kontinuum: pulumi.Output[str]
    endpoint: pulumi.Output[str]

    def __init__(self, resource_name: str, *, hub_kubeconfig: pulumi.Input[str], region: str, zone: str,
                 timeout: float, trigger: pulumi.Input = None, zone_kubeconfig: pulumi.Input[str] | None = None,
                 max_heartbeat_age: float | None = None, opts: pulumi.ResourceOptions | None = None):
        """zone_kubeconfig (optional) lets a timeout report what the zone shows (Deployment
        availability, the server's Warning Events); max_heartbeat_age (optional, seconds)
        rejects a heartbeat older than that, e.g. a registration left from an earlier zone."""
        props = {
            "hubKubeconfig": pulumi.Output.secret(hub_kubeconfig),
            "zoneKubeconfig": pulumi.Output.secret(zone_kubeconfig) if zone_kubeconfig is not None else None,
            "region": region,
            "zone": zone,
            "timeout": timeout,
            "trigger": trigger,
            "maxHeartbeatAge": max_heartbeat_age,
            "joined": None,
            "heartbeat": None,
            "kontinuum": None,
            "endpoint": None,
        }
        super().__init__(RegistryJoinProvider(), resource_name, props, with_secret_outputs(opts, *SECRET_INPUTS))
