"""What is derived from membership follows every join and leave (issue 27), without a network:
the host-network Gateway's addresses come from the members' Nodes only, a changed member set
plans an update that waits again (never a replace), and a refresh that cannot read keeps the
record while one that reads records what it saw."""

from __future__ import annotations

import logging

import pytest

from kontinuum.dns import rfc2136
from kontinuum.dns.rfc2136 import record_lines
from kontinuum.kube import gateways
from kontinuum.kube.gateways import Reach
from providers.dns_record import DnsRecordProvider
from providers.gateway_address import GatewayAddressProvider

CP, LEFT, JOINED, SPARE6 = "192.0.2.1", "192.0.2.2", "192.0.2.3", "2001:db8::3"
GW = {"kubeconfig": "k", "namespace": "kontinuum-system", "name": "kontinuum", "mode": "hostNetwork",
      "setting": "zones[0].ingress", "timeout": 60, "nodeSelector": {}, "pool": False, "fixed": None,
      "trigger": "u/1", "members": [CP, LEFT]}
REC = {"server": "192.0.2.53", "zone": "example.com", "host": "a.eu.example.com", "addresses": [CP, LEFT],
       "ttl": 300, "keyName": "k", "keyAlgorithm": "hmac-sha256", "keySecret": "c2VjcmV0", "timeout": 15}


def node(name: str, *ips: str, ready: bool = True, **labels) -> dict:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"addresses": [{"type": "InternalIP", "address": ip} for ip in ips],
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


# -- which Nodes serve ------------------------------------------------------------------------


def test_a_machine_that_left_drops_out_while_its_node_is_still_ready():
    nodes = [node("cp", CP), node("left", LEFT)]  # its teardown (Node removal) runs after the wait
    assert gateways.member_addresses(nodes, {}, [CP, JOINED]) == ([CP], {JOINED: "no Node has this address yet"})
    nodes.append(node("joined", JOINED, SPARE6))  # dual stack: all its InternalIPs serve
    assert gateways.member_addresses(nodes, {}, [CP, JOINED]) == ([CP, JOINED, SPARE6], {})


def test_only_selected_members_wait_to_be_ready():
    nodes = [node("cp", CP), node("w", JOINED, ready=False, edge="true"), node("x", LEFT, ready=False)]
    found, pending = gateways.member_addresses(nodes, {"edge": "true"}, [CP, JOINED, LEFT])
    # cp and x are not picked by the selector: settled, whatever their state; w is picked, not Ready.
    assert found == [] and pending == {JOINED: "Node w is not Ready"}
    nodes[1] = node("w", JOINED, edge="true")
    assert gateways.member_addresses(nodes, {"edge": "true"}, [CP, JOINED, LEFT]) == ([JOINED], {})
    assert "member 192.0.2.3: Node w is not Ready" == gateways.describe_pending({JOINED: "Node w is not Ready"})


# -- GatewayAddress -----------------------------------------------------------------------------


def test_a_changed_member_set_is_an_update_that_waits_again_never_a_replace():
    p = GatewayAddressProvider()
    recorded = {**GW, "addresses": [CP, LEFT], "pending": []}
    assert not p.diff("id", recorded, dict(GW)).changes
    d = p.diff("id", recorded, {**GW, "members": [CP, JOINED]})
    assert d.changes and not d.replaces
    # State written before members were an input: the first up computes them once.
    old = {k: v for k, v in recorded.items() if k not in ("members", "pending")}
    assert p.diff("id", old, dict(GW)).changes
    # Members that had not come at the bound, or a refresh that found no address: waited for again.
    assert p.diff("id", {**recorded, "pending": [JOINED]}, dict(GW)).changes
    assert p.diff("id", {**recorded, "addresses": []}, dict(GW)).changes
    # loadBalancer zones get no member set: a join or leave does not touch them.
    lb = {**GW, "mode": "loadBalancer", "members": None}
    assert not p.diff("id", {**lb, "addresses": ["192.0.2.100"]}, dict(lb)).changes


def test_the_member_set_is_checked_naming_the_field():
    p = GatewayAddressProvider()
    assert p.check({}, GW).failures == [] and p.check({}, {**GW, "members": None}).failures == []
    for bad in (["192.0.2.1", "not-an-ip"], "192.0.2.1", [3]):
        (failure,) = p.check({}, {**GW, "members": bad}).failures
        assert failure.property == "members" and "IP addresses" in failure.reason, bad


def test_update_waits_for_the_new_members_and_records_who_did_not_come(monkeypatch, caplog):
    seen = []

    def wait(*_a, members=None, **_k):
        seen.append(members)
        return Reach([CP], {JOINED: "no Node has this address yet"})

    monkeypatch.setattr(gateways, "wait_addresses", wait)
    with caplog.at_level(logging.WARNING):
        outs = GatewayAddressProvider().update("kontinuum-system/kontinuum", GW, {**GW, "members": [CP, JOINED]}).outs
    assert seen == [[CP, JOINED]]
    assert outs["addresses"] == [CP] and outs["pending"] == [JOINED]
    assert "member 192.0.2.3: no Node has this address yet" in caplog.text and "waits for them again" in caplog.text
    monkeypatch.setattr(gateways, "wait_addresses", lambda *_a, **_k: Reach([CP, JOINED]))
    outs = GatewayAddressProvider().update("id", GW, {**GW, "members": [CP, JOINED]}).outs
    assert outs["addresses"] == [CP, JOINED] and outs["pending"] == []


def test_refresh_reads_the_gateway_and_keeps_the_record_when_the_cluster_is_silent(monkeypatch, caplog):
    p = GatewayAddressProvider()
    recorded = {**GW, "members": [CP, JOINED], "addresses": [CP, LEFT], "pending": []}

    def silent(*_a, **_k):
        raise ConnectionError("apiserver down")

    monkeypatch.setattr(gateways, "observe_addresses", silent)
    with caplog.at_level(logging.WARNING):
        assert p.read("id", recorded).outs == recorded
    assert "not read (ConnectionError); kept as recorded" in caplog.text
    monkeypatch.setattr(gateways, "observe_addresses", lambda *_a, **_k: Reach([CP, LEFT]))
    assert p.read("id", recorded).outs == recorded  # unchanged: no drift, no noise
    monkeypatch.setattr(gateways, "observe_addresses", lambda *_a, **_k: Reach([CP, JOINED]))
    outs = p.read("id", recorded).outs
    assert outs["addresses"] == [CP, JOINED] and "drift" in caplog.text
    # What follows the refreshed addresses: the manual instructions (and the RFC 2136 record's input).
    assert record_lines("a.eu.example.com", outs["addresses"], 300) == [
        f"a.eu.example.com. 300 IN A {CP}", f"a.eu.example.com. 300 IN A {JOINED}"]
    monkeypatch.setattr(gateways, "observe_addresses", lambda *_a, **_k: Reach([], {}, "the Gateway does not exist"))
    outs = p.read("id", recorded).outs
    assert outs["addresses"] == [] and p.diff("id", outs, {**GW, "members": [CP, JOINED]}).changes


# -- DnsRecord ------------------------------------------------------------------------------------


def test_a_changed_address_list_replaces_the_records(monkeypatch):
    calls = []
    monkeypatch.setattr(rfc2136, "ensure", lambda *a, **k: calls.append(("ensure", a[3])))
    monkeypatch.setattr(rfc2136, "remove", lambda *a, **k: calls.append(("remove", a[3])))
    p = DnsRecordProvider()
    new = {**REC, "addresses": [CP, JOINED]}
    assert p.diff("host", REC, new).changes and not p.diff("host", REC, new).replaces
    p.update("host", REC, new)
    # One replace of the host's sets (ensure), nothing added beside the old ones.
    assert calls == [("ensure", [CP, JOINED])]


def test_dns_refresh_reads_the_rrset_and_keeps_the_record_when_the_server_is_silent(monkeypatch, caplog):
    p = DnsRecordProvider()

    def silent(*_a, **_k):
        raise rfc2136.DnsUpdateError("reading A a.eu.example.com: no answer from DNS server 192.0.2.53:53 within 5 s")

    monkeypatch.setattr(rfc2136, "published", silent)
    with caplog.at_level(logging.WARNING):
        assert p.read("host", REC).outs == REC
    assert "kept as recorded" in caplog.text and "no answer" in caplog.text and REC["keySecret"] not in caplog.text
    monkeypatch.setattr(rfc2136, "published", lambda *_a, **_k: {"A": sorted([CP, LEFT]), "AAAA": []})
    assert p.read("host", REC).outs == REC
    monkeypatch.setattr(rfc2136, "published", lambda *_a, **_k: {"A": [LEFT], "AAAA": []})
    outs = p.read("host", REC).outs
    assert outs["addresses"] == REC["addresses"] and outs["answered"] == [LEFT]  # a delete removes only ours
    assert p.diff("host", outs, dict(REC)).changes  # the next up writes them again
    monkeypatch.setattr(rfc2136, "published", lambda *_a, **_k: {"A": sorted([CP, LEFT]), "AAAA": []})
    assert "answered" not in p.read("host", outs).outs


@pytest.mark.parametrize("timeout", [15, 2])
def test_dns_refresh_is_bounded(monkeypatch, timeout):
    bounds = []
    monkeypatch.setattr(rfc2136, "published", lambda _s, _h, _k, t: bounds.append(t) or {"A": [CP, LEFT], "AAAA": []})
    DnsRecordProvider().read("host", {**REC, "timeout": timeout})
    assert bounds == [min(timeout, 5.0)]


class _Api:
    def close(self):
        pass


class _Waker:
    def __init__(self, *watched):
        self.watched = watched

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def pause(self, seconds):
        return False


def test_at_its_bound_the_wait_publishes_the_members_that_came_or_fails_with_none(monkeypatch):
    monkeypatch.setattr(gateways, "api_client", lambda *_a, **_k: _Api())
    monkeypatch.setattr(gateways.watching, "Waker", _Waker)
    looks = iter([Reach([], {}, "Accepted=True"), Reach([CP], {JOINED: "no Node has this address yet"}, "x")])
    monkeypatch.setattr(gateways, "_observe", lambda *_a: next(looks, Reach([CP], {JOINED: "no Node yet"}, "x")))
    args = dict(mode="hostNetwork", setting="zones[0].ingress", members=[CP, JOINED], interval=0.01)
    reach = gateways.wait_addresses("k", "ns", "gw", timeout=0.05, **args)
    assert reach.addresses == [CP] and reach.pending == {JOINED: "no Node yet"}
    seen = "Accepted=True; no Ready member Node matches the (empty) node selector; member 192.0.2.3: no Node yet"
    monkeypatch.setattr(gateways, "_observe", lambda *_a: Reach([], {JOINED: "no Node yet"}, seen))
    with pytest.raises(gateways.GatewayNoAddress, match="no Ready member Node matches") as e:
        gateways.wait_addresses("k", "ns", "gw", timeout=0.05, **args)
    assert "member 192.0.2.3: no Node yet" in str(e.value) and "zones[0].ingress.nodeSelector" in str(e.value)
    monkeypatch.setattr(gateways, "_observe", lambda *_a: Reach([CP, JOINED]))
    assert gateways.wait_addresses("k", "ns", "gw", timeout=5, **args).addresses == [CP, JOINED]
