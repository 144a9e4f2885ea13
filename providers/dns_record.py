"""DnsRecord: the zone host's A/AAAA records, kept by RFC 2136 dynamic updates (TSIG-signed).

Created with the zone (after its Gateway has addresses), updated when they change (the host's
A/AAAA sets are replaced, so a machine that left is no longer published), deleted with the zone:
only the addresses it published are removed. A refresh reads the sets over DNS, so a record
someone changed shows as drift and the next up puts it back. The TSIG secret arrives as a secret
input and never leaves the provider; every exchange is bounded (kontinuum.dns.rfc2136).
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs, why_not_read, with_secret_outputs

UPDATE_ON = ("server", "zone", "host", "addresses", "ttl", "keyName", "keyAlgorithm", "keySecret")
READ_TIMEOUT = 5.0  # seconds at most per query of a refresh


def _key(props: dict):
    from kontinuum.dns.tsig import TsigKey

    return TsigKey(props["keyName"], props["keyAlgorithm"], props["keySecret"])


class DnsRecordProvider(ResourceProvider):
    def check(self, _olds, news):
        failures = [CheckFailure(k, "required") for k in ("server", "zone", "host", "keyName", "keyAlgorithm",
                                                           "keySecret") if not news.get(k)]
        if not isinstance(news.get("addresses"), list):
            failures.append(CheckFailure("addresses", "must be a list of IP addresses"))
        timeout = news.get("timeout")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            failures.append(CheckFailure("timeout", f"must be a number of seconds > 0, got {timeout!r}"))
        return CheckResult(news, failures)

    def diff(self, _id, olds, news):
        d = diff_inputs(olds, news, update_on=UPDATE_ON)
        if not d.changes and olds.get("answered") is not None:  # a refresh saw other records there
            d.changes = True
        return d

    def create(self, props):
        from kontinuum.dns import rfc2136

        rfc2136.ensure(props["server"], props["zone"], props["host"], list(props["addresses"]), int(props["ttl"]),
                       _key(props), timeout=float(props["timeout"]))
        return CreateResult(id_=props["host"], outs=props)

    def update(self, _id, olds, news):
        from kontinuum.dns import rfc2136

        moved = any(olds.get(k) != news.get(k) for k in ("server", "zone", "host"))
        if moved:  # the old name (or server) loses what we published there
            rfc2136.remove(olds["server"], olds["zone"], olds["host"], list(olds.get("addresses") or []),
                           _key(olds), timeout=float(olds.get("timeout") or news["timeout"]))
        rfc2136.ensure(news["server"], news["zone"], news["host"], list(news["addresses"]), int(news["ttl"]),
                       _key(news), timeout=float(news["timeout"]))
        return UpdateResult(outs=news)

    def read(self, id_, props):
        """Refresh: what the server answers for the host's A/AAAA now (signed queries over TCP,
        each bounded). Other answers are recorded as `answered`, so the next up replaces them;
        a server that does not answer keeps the record (reported)."""
        from kontinuum.dns import rfc2136
        from providers.talos_common import warn

        try:
            timeout = min(float(props.get("timeout") or READ_TIMEOUT), READ_TIMEOUT)
            seen = rfc2136.published(props["server"], props["host"], _key(props), timeout)
            recorded = rfc2136.by_type(list(props.get("addresses") or []))
        except Exception as exc:  # noqa: BLE001 - any failure to read is reported, never fatal
            warn(f"DnsRecord {id_}: not read from {props.get('server')} ({why_not_read(exc)}); kept as recorded")
            return ReadResult(id_=id_, outs=props)
        if seen == recorded:  # in sync (again): nothing to rewrite
            return ReadResult(id_=id_, outs={k: v for k, v in props.items() if k != "answered"})
        answered = [a for rtype in ("A", "AAAA") for a in seen.get(rtype, [])]
        warn(f"DnsRecord {id_}: drift: {props.get('server')} answers {answered or 'nothing'} for {props['host']}, "
             f"recorded {props.get('addresses')}; the next up writes the Gateway's addresses again")
        # `addresses` stays what this record published (all that a delete removes); `answered`
        # makes the next diff plan the rewrite.
        return ReadResult(id_=id_, outs={**props, "answered": answered})

    def delete(self, _id, props):
        from kontinuum.dns import rfc2136

        rfc2136.remove(props["server"], props["zone"], props["host"], list(props.get("addresses") or []),
                       _key(props), timeout=float(props["timeout"]))


class DnsRecord(TypedResource, module="dns", name="DnsRecord"):
    """Outputs: the inputs (keySecret stays secret)."""

    def __init__(self, resource_name: str, *, server: str, zone: str, host: str, addresses: pulumi.Input[list],
                 ttl: int, key_name: str, key_algorithm: str, key_secret: pulumi.Input[str], timeout: float = 15.0,
                 opts: pulumi.ResourceOptions | None = None):
        props = {"server": server, "zone": zone, "host": host, "addresses": addresses, "ttl": ttl,
                 "keyName": key_name, "keyAlgorithm": key_algorithm, "keySecret": pulumi.Output.secret(key_secret),
                 "timeout": timeout}
        super().__init__(DnsRecordProvider(), resource_name, props, with_secret_outputs(opts, "keySecret"))
