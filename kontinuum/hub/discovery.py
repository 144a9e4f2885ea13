"""Discovery: probe an Instance's addresses in maintenance mode and record what answered.

Discovery and claiming are independent (seeds, stage 1): an Instance may be claimed before
it is discovered, and a failed probe is recorded on the hub object as Discovered=False with
every address's error, so an operator sees why without our logs.
"""

from __future__ import annotations

import datetime as dt

from kontinuum.errors import KontinuumError
from kontinuum.hub.inventory import Inventory
from kontinuum.talos.answers import Discovery
from kontinuum.talos.client import Deadlines, discover
from kontinuum.talos.errors import NotInMaintenanceError, TalosError


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
        "fingerprint": found.fingerprint,
        "interfaces": interfaces,
        "conditions": [_condition(True, "Probed", f"Talos {found.talos_version} answered on {found.address}")],
    }


def record_found(inv: Inventory, name: str, found: Discovery) -> None:
    """Record a machine seen in maintenance mode (after discovery, or after our own reset
    brought it back): its address and the certificate a later apply must see again."""
    inv.set_status(name, _found_status(found))


def recorded(obj: dict | None) -> dict:
    """The output properties of what the hub recorded for an Instance (no probe)."""
    status = (obj or {}).get("status") or {}
    return {
        "discovered": bool(status.get("discovered")),
        "address": status.get("address"),
        "talosVersion": status.get("talosVersion"),
        "fingerprint": status.get("fingerprint"),
        "links": [i["name"] for i in status.get("interfaces") or []],
    }


def probe(interfaces: list[str], *, port: int = 50000, timeout: float = 10.0
          ) -> tuple[Discovery | None, list[str], str | None]:
    """First address that answers in maintenance mode, else None and one error line per
    address (each bounded); the third item is the first address whose machine answered but
    has left maintenance mode (it runs a config)."""
    errors, configured = [], None
    for address in interfaces:
        try:
            return discover(address, port=port, deadlines=Deadlines(discover=timeout)), errors, None
        except NotInMaintenanceError as e:
            configured = configured or address
            errors.append(f"{address}: {e.problem}")
        except TalosError as e:
            errors.append(f"{address}: {e.problem}")
    return None, errors, configured


def probe_and_record(inv: Inventory, name: str, interfaces: list[str], *, port: int = 50000,
                     timeout: float = 10.0, raise_if_unreachable: bool = True) -> dict:
    """Probe, write the result to the Instance's status, and return the output properties."""
    found, errors, configured = probe(interfaces, port=port, timeout=timeout)
    if found is not None:
        status = _found_status(found)
    elif configured is not None:
        # A member that runs its config (re-registered after an out-of-band delete, or read by
        # refresh): it answered, so it is discovered; its cluster's mTLS decides the rest.
        status = {"discovered": True, "address": configured, "conditions": [_condition(
            True, "Configured", f"the machine answers on {configured} and has left maintenance mode")]}
    else:
        status = {"discovered": False,
                  "conditions": [_condition(False, "Unreachable", "; ".join(errors))]}
    inv.set_status(name, status)
    if not status["discovered"] and raise_if_unreachable:
        raise DiscoveryFailed(
            f"Instance {name}: no address answered in maintenance mode within {timeout:.0f} s each "
            f"({'; '.join(errors)}). Check that the machine is booted into Talos maintenance mode and "
            "port 50000 is reachable, or fix spec.interfaces; the next `pulumi up` probes again."
        )
    return recorded({"status": status})
