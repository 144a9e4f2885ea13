"""Discovery: probe an Instance's addresses in maintenance mode and record what answered.

Discovery and claiming are independent (seeds, stage 1): an Instance may be claimed before
it is discovered, and a failed probe is recorded on the hub object as Discovered=False with
every address's error, so an operator sees why without our logs.
"""

from __future__ import annotations

import datetime as dt

from kontinuum.errors import KontinuumError
from kontinuum.hub.inventory import Inventory
from kontinuum.talos.client import Deadlines, Discovery, discover
from kontinuum.talos.errors import TalosError


class DiscoveryFailed(KontinuumError):
    pass


def _condition(status: bool, reason: str, message: str) -> dict:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "Discovered", "status": "True" if status else "False", "reason": reason,
            "message": message[:32000], "lastTransitionTime": now}


def _found_status(found: Discovery) -> dict:
    by_link: dict[str, list[str]] = {}
    for a in found.addresses:
        by_link.setdefault(a.link, []).append(a.cidr)
    interfaces = [{"name": link.name, "mac": link.mac, "addresses": by_link.get(link.name, [])} for link in found.links]
    return {
        "discovered": True,
        "address": found.address,
        "talosVersion": found.talos_version,
        "interfaces": interfaces,
        "conditions": [_condition(True, "Probed", f"Talos {found.talos_version} answered on {found.address}")],
    }


def probe(interfaces: list[str], *, port: int = 50000, timeout: float = 10.0) -> tuple[Discovery | None, list[str]]:
    """First address that answers, else None and one error line per address (each bounded)."""
    errors = []
    for address in interfaces:
        try:
            return discover(address, port=port, deadlines=Deadlines(discover=timeout)), errors
        except TalosError as e:
            errors.append(f"{address}: {e.problem}")
    return None, errors


def probe_and_record(inv: Inventory, name: str, interfaces: list[str], *, port: int = 50000,
                     timeout: float = 10.0, raise_if_unreachable: bool = True) -> dict:
    """Probe, write the result to the Instance's status, and return the output properties."""
    found, errors = probe(interfaces, port=port, timeout=timeout)
    if found is not None:
        status = _found_status(found)
    else:
        status = {"discovered": False,
                  "conditions": [_condition(False, "Unreachable", "; ".join(errors))]}
    inv.set_status(name, status)
    if found is None and raise_if_unreachable:
        raise DiscoveryFailed(
            f"Instance {name}: no address answered in maintenance mode within {timeout:.0f} s each "
            f"({'; '.join(errors)}). Check that the machine is booted into Talos maintenance mode and "
            "port 50000 is reachable, or fix spec.interfaces; the next `pulumi up` probes again."
        )
    return {
        "discovered": status["discovered"],
        "address": status.get("address"),
        "talosVersion": status.get("talosVersion"),
        "links": [i["name"] for i in status.get("interfaces", [])],
    }
