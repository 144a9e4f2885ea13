"""The zone host's A/AAAA records by RFC 2136 dynamic update, signed with TSIG (dnspython).

Every exchange is over TCP with an explicit timeout. `ensure` replaces the host's A and AAAA
sets with exactly the given addresses (idempotent: a re-run converges) and then reads them back
from the server; `remove` deletes only the given addresses, leaving anything someone else added.
Messages name the server, zone, host and key, never the key's secret.
"""

from __future__ import annotations

import ipaddress
import time

import dns.exception
import dns.message
import dns.name
import dns.query
import dns.rcode
import dns.rdatatype
import dns.resolver
import dns.tsig
import dns.update

from kontinuum.dns.tsig import TsigKey
from kontinuum.errors import KontinuumError

DEFAULT_PORT = 53


class DnsUpdateError(KontinuumError):
    """The server did not take the update (or could not be reached) within the bound."""


def split_server(server: str) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]:port` or a bare IPv6 address → (host, port)."""
    if server.startswith("["):
        host, _, port = server[1:].partition("]")
        return host, int(port.lstrip(":") or DEFAULT_PORT)
    if server.count(":") == 1:
        host, port = server.split(":")
        return host, int(port)
    return server, DEFAULT_PORT


def by_type(addresses: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"A": [], "AAAA": []}
    for a in addresses:
        out["A" if ipaddress.ip_address(a).version == 4 else "AAAA"].append(str(ipaddress.ip_address(a)))
    return {k: sorted(set(v)) for k, v in out.items()}


def record_lines(host: str, addresses: list[str], ttl: int) -> list[str]:
    """The records, in zone-file form, for the manual mode's output."""
    return [f"{host.rstrip('.')}. {ttl} IN {t} {a}" for t, values in by_type(addresses).items() for a in values]


def _server_ip(host: str, timeout: float) -> str:
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        answer = dns.resolver.resolve(host, "A", lifetime=timeout)
    except dns.exception.DNSException as e:
        raise DnsUpdateError(f"DNS server {host}: cannot resolve its name ({e.__class__.__name__}); "
                             "give its address in dns.server") from None
    return str(answer[0])


def _describe_key(key: TsigKey) -> str:
    return f"TSIG key {key.name!r} ({key.algorithm})"


def _send(msg, server: str, timeout: float, what: str, key: TsigKey, zone: str, ok=(dns.rcode.NOERROR,)):
    host, port = split_server(server)
    ip = _server_ip(host, timeout)
    try:
        response = dns.query.tcp(msg, ip, port=port, timeout=timeout)
    except dns.exception.Timeout:
        raise DnsUpdateError(f"{what}: no answer from DNS server {host}:{port} within {timeout:g} s") from None
    except dns.tsig.PeerError as e:
        raise DnsUpdateError(f"{what}: DNS server {host}:{port} rejected the {_describe_key(key)}: "
                             f"{e.__class__.__name__} (wrong name, secret or algorithm, or the server does not know "
                             "the key)") from None
    except dns.exception.FormError as e:
        if "TSIG" not in str(e):
            raise DnsUpdateError(f"{what}: DNS server {host}:{port}: malformed answer ({e})") from None
        # An unsigned refusal (NOTAUTH/REFUSED) to a signed request: the server does not know the
        # zone or the key.
        raise DnsUpdateError(f"{what}: DNS server {host}:{port} answered without a TSIG signature: it is not "
                             f"authoritative for zone {zone} or does not know the {_describe_key(key)}") from None
    except (OSError, EOFError, dns.exception.DNSException) as e:
        raise DnsUpdateError(f"{what}: DNS server {host}:{port}: {e.__class__.__name__}: {e}") from None
    rcode = response.rcode()
    if rcode not in ok:
        hint = {
            dns.rcode.NOTAUTH: f"the server is not authoritative for zone {zone} or does not accept the "
                               f"{_describe_key(key)} for it",
            dns.rcode.REFUSED: f"the zone's update policy does not let the {_describe_key(key)} change this name",
            dns.rcode.NOTZONE: f"the name is outside zone {zone}",
            dns.rcode.SERVFAIL: "the server failed to apply it (see its log)",
        }.get(rcode, "see the server's log")
        raise DnsUpdateError(f"{what}: DNS server {host}:{port} answered {dns.rcode.to_text(rcode)}: {hint}")
    return response


def _update(zone: str, key: TsigKey) -> dns.update.UpdateMessage:
    keyring = dns.tsig.Key(key.name, key.secret, key.algorithm)
    return dns.update.UpdateMessage(dns.name.from_text(zone), keyring=keyring)


def published(server: str, host: str, key: TsigKey, timeout: float) -> dict[str, list[str]]:
    """What the server answers for the host's A and AAAA (asked over TCP, signed)."""
    out = {}
    for rtype in ("A", "AAAA"):
        q = dns.message.make_query(dns.name.from_text(host), rtype)
        q.use_tsig(dns.tsig.Key(key.name, key.secret, key.algorithm))
        response = _send(q, server, timeout, f"reading {rtype} {host}", key, host,
                         ok=(dns.rcode.NOERROR, dns.rcode.NXDOMAIN))
        out[rtype] = sorted(str(rd) for rrset in response.answer if rrset.rdtype == dns.rdatatype.from_text(rtype)
                            for rd in rrset)
    return out


def ensure(server: str, zone: str, host: str, addresses: list[str], ttl: int, key: TsigKey, *,
           timeout: float = 10.0) -> None:
    """The host's A/AAAA sets are exactly `addresses` (bounded; reads them back)."""
    deadline = time.monotonic() + timeout
    want = by_type(addresses)
    msg = _update(zone, key)
    name = dns.name.from_text(host)
    for rtype, values in want.items():
        if values:
            msg.replace(name, ttl, rtype, *values)
        else:
            msg.delete(name, rtype)
    _send(msg, server, timeout, f"updating {host} in zone {zone}", key, zone)
    got = published(server, host, key, max(1.0, deadline - time.monotonic()))
    if got != want:
        raise DnsUpdateError(f"updating {host} in zone {zone}: DNS server {server} took the update but answers "
                             f"{got} instead of {want}; is it the zone's primary?")


def remove(server: str, zone: str, host: str, addresses: list[str], key: TsigKey, *, timeout: float = 10.0) -> None:
    """Delete exactly these addresses of the host (absent ones are no error)."""
    if not addresses:
        return
    msg = _update(zone, key)
    name = dns.name.from_text(host)
    for rtype, values in by_type(addresses).items():
        for value in values:
            msg.delete(name, rtype, value)
    _send(msg, server, timeout, f"deleting {host} from zone {zone}", key, zone)
