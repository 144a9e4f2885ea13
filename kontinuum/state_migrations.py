"""Moves of existing stacks' state to the current resource layout, found by reading an
exported deployment (pure) and carried out with the engine's own `pulumi state rename`.

Per-machine members: stacks made before members were keyed by machine hold one ConfigApply
per pool slot (`<region>-<zone>-<pool>-<i>`). Each is renamed to the machine it configures,
found by the address it recorded among the zone's Instances, so the next `pulumi up` sees the
same machine under its new name and touches no node. A slot whose address matches no
Instance is left alone and reported: renaming it to a guess could reset the wrong machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DYNAMIC = "pulumi-python:dynamic"  # every dynamic type, the one-for-all of old and today's own
_SLOT = re.compile(r"^(?P<cluster>.+)-(?P<pool>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<slot>\d+)$")
_INSTANCE = re.compile(r"^(?P<cluster>.+)-[0-9a-f]{8}$")


@dataclass(frozen=True)
class Rename:
    urn: str
    new_name: str


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def _type(urn: str) -> str:
    return urn.rsplit("::", 2)[-2].rsplit("$", 1)[-1]


def member_renames(deployment: dict) -> tuple[list[Rename], list[str]]:
    """(renames to make, one line per slot resource that cannot be matched)."""
    resources = [r for r in deployment.get("resources") or [] if _type(r.get("urn", "")).startswith(DYNAMIC)]
    by_cluster: dict[str, dict[str, str]] = {}  # cluster → address → Instance name
    for r in resources:
        outs = r.get("outputs") or {}
        m = _INSTANCE.match(_name(r["urn"]))
        if m and "interfaces" in outs and "discovered" in outs:
            addresses = by_cluster.setdefault(m.group("cluster"), {})
            for a in [outs.get("address"), *(outs.get("interfaces") or [])]:
                if isinstance(a, str):
                    addresses.setdefault(a, _name(r["urn"]))
    taken = {_name(r["urn"]) for r in resources if "configHash" in (r.get("outputs") or {})}
    renames, unmatched = [], []
    for r in resources:
        outs = r.get("outputs") or {}
        m = _SLOT.match(_name(r["urn"]))
        if not m or "configHash" not in outs or outs.get("instance"):
            continue
        target = by_cluster.get(m.group("cluster"), {}).get(outs.get("address"))
        if target is None or target in taken:
            why = "no Instance of the zone has that address" if target is None else f"{target} exists already"
            unmatched.append(f"{_name(r['urn'])} (address {outs.get('address')}): {why}")
            continue
        taken.add(target)
        renames.append(Rename(r["urn"], target))
    return renames, unmatched
