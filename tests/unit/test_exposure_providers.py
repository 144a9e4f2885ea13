"""GatewayAddress and DnsRecord providers: pure check/diff (a preview contacts nothing)."""

from providers.dns_record import DnsRecordProvider
from providers.gateway_address import GatewayAddressProvider

GW = {"kubeconfig": "k", "namespace": "kontinuum-system", "name": "kontinuum", "mode": "hostNetwork",
      "setting": "zones[0].ingress", "timeout": 60, "nodeSelector": {}, "pool": False, "fixed": None, "trigger": "u/1"}
REC = {"server": "192.0.2.53", "zone": "example.com", "host": "a.eu.example.com", "addresses": ["192.0.2.1"],
       "ttl": 300, "keyName": "k", "keyAlgorithm": "hmac-sha256", "keySecret": "c2VjcmV0", "timeout": 15}


def test_gateway_address_check_and_diff():
    p = GatewayAddressProvider()
    assert p.check({}, GW).failures == []
    bad = p.check({}, {**GW, "mode": "nodePort", "timeout": -1, "kubeconfig": ""}).failures
    assert {f.property for f in bad} == {"mode", "timeout", "kubeconfig"}
    assert not p.diff("id", GW, dict(GW)).changes
    for key, value in (("mode", "loadBalancer"), ("trigger", "u/2"), ("fixed", "192.0.2.9"), ("pool", True)):
        d = p.diff("id", GW, {**GW, key: value})
        assert d.changes and not d.replaces, key
    assert not p.diff("id", GW, {**GW, "timeout": 90}).changes  # a new bound alone does not wait again


def test_dns_record_check_and_diff():
    p = DnsRecordProvider()
    assert p.check({}, REC).failures == []
    bad = p.check({}, {**REC, "keySecret": "", "addresses": None, "timeout": 0}).failures
    assert {f.property for f in bad} == {"keySecret", "addresses", "timeout"}
    assert not p.diff("id", REC, dict(REC)).changes
    d = p.diff("id", REC, {**REC, "addresses": ["192.0.2.2"]})
    assert d.changes and not d.replaces  # an update: replaces the host's records in place
