"""RFC 2136 updates with TSIG against a real Knot DNS server on 127.0.40.201."""

from __future__ import annotations

import base64

import pytest

from kontinuum.dns import rfc2136
from kontinuum.dns.tsig import TsigKey
from lab.knot import KnotServer

ADDRESS, PORT = "127.0.40.201", 5353
ZONE = "lab.kontinuum.test"
HOST = "a.lab.kontinuum.test"
SECRET = base64.b64encode(b"kontinuum-test-tsig-secret-32byt").decode()
KEY = TsigKey("kontinuum-updater", "hmac-sha256", SECRET)
SERVER = f"{ADDRESS}:{PORT}"


@pytest.fixture(scope="module")
def dns_server(tmp_path_factory):
    server = KnotServer(tmp_path_factory.mktemp("knot"), address=ADDRESS, port=PORT, zone=ZONE,
                        key_name=KEY.name, key_secret=SECRET).start()
    yield server
    server.stop()


def test_ensure_replaces_and_remove_deletes_only_ours(dns_server):
    rfc2136.ensure(SERVER, ZONE, HOST, ["127.0.40.100"], 300, KEY, timeout=10)
    assert dns_server.lookup(HOST) == ["127.0.40.100"]
    rfc2136.ensure(SERVER, ZONE, HOST, ["127.0.40.101", "127.0.40.102", "fd00::1"], 300, KEY, timeout=10)
    assert dns_server.lookup(HOST) == ["127.0.40.101", "127.0.40.102"]
    assert dns_server.lookup(HOST, "AAAA") == ["fd00::1"]
    rfc2136.ensure(SERVER, ZONE, HOST, ["127.0.40.101", "127.0.40.102", "fd00::1"], 300, KEY, timeout=10)  # idempotent
    rfc2136.remove(SERVER, ZONE, HOST, ["127.0.40.102", "fd00::1"], KEY, timeout=10)
    assert dns_server.lookup(HOST) == ["127.0.40.101"] and dns_server.lookup(HOST, "AAAA") == []
    rfc2136.remove(SERVER, ZONE, HOST, ["127.0.40.101", "127.0.40.102"], KEY, timeout=10)  # absent: no error
    assert dns_server.lookup(HOST) == []


def test_refusals_name_the_key_and_zone_without_the_secret(dns_server):
    wrong = TsigKey(KEY.name, "hmac-sha256", base64.b64encode(b"another-secret-of-thirty-two-byt").decode())
    with pytest.raises(rfc2136.DnsUpdateError) as e:
        rfc2136.ensure(SERVER, ZONE, HOST, ["127.0.40.100"], 300, wrong, timeout=10)
    assert "kontinuum-updater" in str(e.value) and wrong.secret not in str(e.value)
    unknown = TsigKey("nobody", "hmac-sha256", SECRET)
    with pytest.raises(rfc2136.DnsUpdateError, match="nobody"):
        rfc2136.ensure(SERVER, ZONE, HOST, ["127.0.40.100"], 300, unknown, timeout=10)
    with pytest.raises(rfc2136.DnsUpdateError, match="not authoritative for zone other.test"):
        rfc2136.ensure(SERVER, "other.test", "a.other.test", ["127.0.40.100"], 300, KEY, timeout=10)
    with pytest.raises(rfc2136.DnsUpdateError, match="no answer|ConnectionRefused"):
        rfc2136.ensure(f"{ADDRESS}:5354", ZONE, HOST, ["127.0.40.100"], 300, KEY, timeout=2)


def test_the_record_follows_the_members_and_a_refresh_reads_it(dns_server):
    """Issue 27: a member leaves and another joins: the update replaces the host's set (the one
    that left is gone from DNS); a refresh reads the set (signed, bounded) and records a change
    made behind our back, so the next up writes it again; a silent server keeps the record."""
    import time

    from providers.dns_record import DnsRecordProvider

    p = DnsRecordProvider()
    host = "members.lab.kontinuum.test"
    props = {"server": SERVER, "zone": ZONE, "host": host, "addresses": ["127.0.40.11", "127.0.40.12"], "ttl": 120,
             "keyName": KEY.name, "keyAlgorithm": KEY.algorithm, "keySecret": SECRET, "timeout": 10}
    outs = p.create(props).outs
    assert dns_server.lookup(host) == ["127.0.40.11", "127.0.40.12"]
    news = {**props, "addresses": ["127.0.40.11", "127.0.40.13"]}  # .12 left, .13 joined
    assert p.diff(host, outs, news).changes
    outs = p.update(host, outs, news).outs
    assert dns_server.lookup(host) == ["127.0.40.11", "127.0.40.13"]
    assert p.read(host, outs).outs == outs  # in sync: nothing recorded

    rfc2136.ensure(SERVER, ZONE, host, ["127.0.40.12"], 120, KEY, timeout=10)  # someone else's change
    read = p.read(host, outs).outs
    assert read["answered"] == ["127.0.40.12"] and read["addresses"] == outs["addresses"]
    assert p.diff(host, read, news).changes
    outs = p.update(host, read, news).outs
    assert dns_server.lookup(host) == ["127.0.40.11", "127.0.40.13"] and "answered" not in outs

    started = time.monotonic()
    assert p.read(host, {**outs, "server": f"{ADDRESS}:5354"}).outs["addresses"] == outs["addresses"]
    assert time.monotonic() - started < 12  # a refresh never hangs on a silent server
    p.delete(host, outs)
    assert dns_server.lookup(host) == []
