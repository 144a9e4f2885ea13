"""RegionGuard: `pulumi up` with no zones left refuses to tear down a region that still has zones.

A stack config that lost its zones (a bad merge, a wrong file) would otherwise read as "remove
every zone": every cluster torn down and every machine reset. Removing a region is what
`pulumi destroy` is for. The check is pure (old inputs against new ones), so `pulumi preview`
fails the same way, before anything is touched. Removing some zones stays a normal `up`;
`kontinuum:allowEmptyRegion: true` lets the rare intended case through.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs

SWITCH = "kontinuum:allowEmptyRegion"


def emptying_problem(olds: dict, news: dict) -> str | None:
    """Why this change may not happen, or None."""
    had = olds.get("zones") or []
    if not had or news.get("zones") or news.get("allowEmpty"):
        return None
    return (f"region {news.get('region')}: kontinuum:zones is empty, but the region still has zone"
            f"{'s' * (len(had) != 1)} {', '.join(had)}; this `up` would tear every one down and reset its "
            f"machines. To remove the region run `pulumi destroy`; if emptying it with `up` is really "
            f"intended, set `{SWITCH}: true` for this run")


class RegionGuardProvider(ResourceProvider):
    def check(self, olds, news):
        problem = emptying_problem(olds or {}, news)
        return CheckResult(news, [CheckFailure("zones", problem)] if problem else [])

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=("region", "zones", "allowEmpty"))

    def create(self, props):
        return CreateResult(id_=props["region"], outs=props)

    def update(self, _id, _olds, news):
        return UpdateResult(outs=news)


class RegionGuard(TypedResource, module="kontinuum", name="RegionGuard"):
    def __init__(self, resource_name: str, *, region: str, zones: list[str], allow_empty: bool,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(RegionGuardProvider(), resource_name,
                         {"region": region, "zones": sorted(zones), "allowEmpty": allow_empty}, opts)
