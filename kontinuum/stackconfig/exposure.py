"""Typed `zones[].ingress` and `zones[].dns`, and the checks that need several values at once.

Shapes and formats come from the contract; this module refuses what the contract cannot see on
one value alone: a setting of the other mode, a fixed address outside its pool, pools that
overlap (inside a zone, across zones, or with a machine's own address), an RFC 2136 zone that
does not hold the zone host, a TSIG key name that `kontinuum:dnsTsigKeys` does not define.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

HOST_NETWORK, LOAD_BALANCER = "hostNetwork", "loadBalancer"
MANUAL, RFC2136 = "manual", "rfc2136"


@dataclass(frozen=True)
class Ingress:
    mode: str = HOST_NETWORK
    node_selector: dict = field(default_factory=dict)
    addresses: tuple[str, ...] = ()  # CIDRs or first-last ranges (loadBalancer)
    interfaces: tuple[str, ...] = ()
    address: str | None = None  # fixed Gateway address (loadBalancer)


@dataclass(frozen=True)
class Dns:
    mode: str = MANUAL
    server: str | None = None
    zone: str | None = None  # None: hub.dnsDomain
    key_name: str | None = None
    ttl: int = 300


def block_range(block: str) -> tuple[ipaddress._BaseAddress, ipaddress._BaseAddress]:
    """(first, last) of a contract-checked CIDR or first-last range."""
    if "/" in block:
        net = ipaddress.ip_network(block, strict=True)
        return net.network_address, net.broadcast_address
    first, _, last = block.partition("-")
    a = ipaddress.ip_address(first.strip())
    return a, ipaddress.ip_address(last.strip()) if last else a


def _overlap(a: str, b: str) -> bool:
    (a1, a2), (b1, b2) = block_range(a), block_range(b)
    return a1.version == b1.version and a1 <= b2 and b1 <= a2


def _contains(block: str, ip: str) -> bool:
    first, last = block_range(block)
    addr = ipaddress.ip_address(ip)
    return addr.version == first.version and first <= addr <= last


def ingress(raw: dict, path: str, errs) -> Ingress:
    mode = raw.get("mode", HOST_NETWORK)
    out = Ingress(mode, dict(raw.get("nodeSelector") or {}), tuple(raw.get("addresses") or ()),
                  tuple(raw.get("interfaces") or ()), raw.get("address"))
    if mode == HOST_NETWORK:
        for key in ("addresses", "interfaces", "address"):
            if raw.get(key):
                errs.add(f"{path}.{key}", f"only for mode: loadBalancer (host-network mode serves the Gateway on the "
                         f"nodes' own addresses); remove it or set {path}.mode: loadBalancer")
        return out
    if raw.get("nodeSelector"):
        errs.add(f"{path}.nodeSelector", f"only for mode: hostNetwork; with mode: loadBalancer the Gateway's address "
                 f"comes from {path}.addresses")
    for key in ("interfaces", "address"):
        if raw.get(key) and not out.addresses:
            errs.add(f"{path}.{key}", f"needs {path}.addresses (the pool Kontinuum creates and announces)")
    for j, block in enumerate(out.addresses):
        for i in range(j):
            if _overlap(out.addresses[i], block):
                errs.add(f"{path}.addresses[{j}]", f"{block} overlaps {path}.addresses[{i}] ({out.addresses[i]})")
    if out.address and out.addresses and not any(_contains(b, out.address) for b in out.addresses):
        errs.add(f"{path}.address", f"{out.address} is not inside {path}.addresses ({', '.join(out.addresses)}); "
                 "LB-IPAM only hands out addresses of the pool")
    return out


def dns(raw: dict, path: str, errs) -> Dns:
    out = Dns(raw.get("mode", MANUAL), raw.get("server"), raw.get("zone"), raw.get("keyName"), raw.get("ttl", 300))
    if out.mode == MANUAL:
        for key in ("server", "zone", "keyName"):
            if raw.get(key):
                errs.add(f"{path}.{key}", f"only for mode: rfc2136; remove it or set {path}.mode: rfc2136")
    else:
        for key in ("server", "keyName"):
            if not raw.get(key):
                errs.add(f"{path}.{key}", "required with mode: rfc2136")
    return out


def check_region(region, hub, zones, index, keys: dict | None, keys_text: str | None, errs) -> None:
    """Pools across zones and against machine addresses; RFC 2136 zones and keys."""
    blocks = [(i, z, j, b) for i, z in zip(index, zones) if z.ingress.mode == LOAD_BALANCER
              for j, b in enumerate(z.ingress.addresses)]
    for n, (i, z, j, b) in enumerate(blocks):
        for (oi, oz, oj, ob) in blocks[:n]:
            if oi != i and _overlap(ob, b):
                errs.add(f"zones[{i}].ingress.addresses[{j}]", f"{b} overlaps zones[{oi}].ingress.addresses[{oj}] "
                         f"({ob}) of zone {oz.zone}: each zone's Gateway needs addresses of its own")
        for mi, mz in zip(index, zones):
            for k, machine in enumerate(mz.machines):
                for a in machine.addresses:
                    try:
                        inside = _contains(b, a)
                    except ValueError:
                        continue  # a host name: not judged here
                    if inside:
                        errs.add(f"zones[{i}].ingress.addresses[{j}]", f"{b} contains {a}, the address of "
                                 f"zones[{mi}].talosAddresses[{k}]: the pool must be free addresses")
    for i, z in zip(index, zones):
        if z.dns.mode != RFC2136 or hub is None:
            continue
        host = f"{z.zone}.{region}.{hub.dns_domain}".lower()
        zone = (z.dns.zone or hub.dns_domain).rstrip(".").lower()
        if host != zone and not host.endswith("." + zone):
            errs.add(f"zones[{i}].dns.zone", f"{zone} does not hold the zone host {host}")
        if not z.dns.key_name:
            continue
        if keys_text is None:
            errs.add(f"zones[{i}].dns.keyName", "kontinuum:dnsTsigKeys is not set: `pulumi config set --secret "
                     "kontinuum:dnsTsigKeys < tsig.key` (the key file tsig-keygen prints)")
        elif keys is not None and z.dns.key_name.rstrip(".").lower() not in keys:
            errs.add(f"zones[{i}].dns.keyName", f"no key {z.dns.key_name!r} in kontinuum:dnsTsigKeys "
                     f"(it defines {', '.join(sorted(keys))})")
