"""zones[].ingress, zones[].dns, hub.acme.caBundle and kontinuum:dnsTsigKeys: defaults, and
path-precise refusals before anything is registered."""

import base64

import pytest

from kontinuum.errors import ConfigErrors
from kontinuum.talos import pki
from kontinuum.stackconfig.parse import parse
from kontinuum.stackconfig.validation import validate

HUB = {"dnsDomain": "example.com", "grpcEndpoint": "hub.example.com:443",
       "acme": {"email": "ops@example.com"}, "auth": {"mode": "anonymous"}}
KEYS = 'key "updater" {\n\talgorithm hmac-sha256;\n\tsecret "' + base64.b64encode(b"x" * 32).decode() + '";\n};\n'


def stack(*zones, **top):
    zs = [{"zone": f"z{i}", "talosAddresses": [f"10.0.{i}.5"], **z} for i, z in enumerate(zones or [{}])]
    return {"region": "eu", "hub": HUB, "zones": zs, **top}


def problems(raw) -> list[str]:
    with pytest.raises(ConfigErrors) as e:
        parse(raw)
    return [str(x) for x in e.value.errors]


def test_defaults_host_network_and_manual_dns():
    z = parse(stack()).zones[0]
    assert (z.ingress.mode, z.ingress.node_selector, z.dns.mode, z.dns.ttl) == ("hostNetwork", {}, "manual", 300)
    assert z.timeouts["gateway"] == 300


def test_defaults_apply_and_the_zone_wins():
    raw = stack({}, {"ingress": {"mode": "hostNetwork", "nodeSelector": {"edge": "true"}}},
                defaults={"ingress": {"mode": "loadBalancer", "addresses": ["192.0.2.0/28"]}})
    raw["zones"][1]["ingress"]["addresses"] = []
    a, b = parse(raw).zones
    assert (a.ingress.mode, a.ingress.addresses) == ("loadBalancer", ("192.0.2.0/28",))
    assert (b.ingress.mode, b.ingress.node_selector, b.ingress.addresses) == ("hostNetwork", {"edge": "true"}, ())


def test_settings_of_the_other_mode_are_refused():
    out = problems(stack({"ingress": {"interfaces": ["^eth0$"], "address": "192.0.2.1"}},
                         {"ingress": {"mode": "loadBalancer", "nodeSelector": {"a": "b"}}}))
    assert any(p.startswith("zones[0].ingress.interfaces: only for mode: loadBalancer") for p in out)
    assert any(p.startswith("zones[0].ingress.address: only for mode: loadBalancer") for p in out)
    assert any(p.startswith("zones[1].ingress.nodeSelector: only for mode: hostNetwork") for p in out)


def test_bad_blocks_and_fixed_address_outside_the_pool():
    out = problems(stack({"ingress": {"mode": "loadBalancer", "address": "192.0.2.99", "interfaces": ["(eth"],
                                      "addresses": ["192.0.2.1/28", "192.0.2.20-192.0.2.10", "192.0.2.0-::1",
                                                    "192.0.2.32/29", "192.0.2.36"]}}))
    for expected in ["zones[0].ingress.addresses[0]: must be a CIDR", "host bits set",
                     "zones[0].ingress.addresses[1]: must be a CIDR (192.0.2.0/28) or a range first-last "
                     "(192.0.2.10-192.0.2.20): the first address comes after the last",
                     "zones[0].ingress.addresses[2]: must be a CIDR", "both ends of one address family",
                     "zones[0].ingress.addresses[1]: 192.0.2.36 overlaps zones[0].ingress.addresses[0] (192.0.2.32/29)",
                     "zones[0].ingress.address: 192.0.2.99 is not inside zones[0].ingress.addresses",
                     "zones[0].ingress.interfaces[0]: must be a regular expression"]:
        assert any(expected in p for p in out), (expected, out)


def test_fixed_address_and_interfaces_need_a_pool():
    out = problems(stack({"ingress": {"mode": "loadBalancer", "address": "192.0.2.9", "interfaces": ["eth0"]}}))
    assert "zones[0].ingress.address: needs zones[0].ingress.addresses (the pool Kontinuum creates and announces)" in out
    assert any(p.startswith("zones[0].ingress.interfaces: needs") for p in out)


def test_pools_overlapping_across_zones_or_holding_a_machine_are_refused():
    lb = lambda *a: {"ingress": {"mode": "loadBalancer", "addresses": list(a)}}  # noqa: E731
    out = problems(stack(lb("192.0.2.0/28"), lb("192.0.2.10-192.0.2.20"), lb("10.0.0.0/29")))
    assert ("zones[1].ingress.addresses[0]: 192.0.2.10-192.0.2.20 overlaps zones[0].ingress.addresses[0] "
            "(192.0.2.0/28) of zone z0: each zone's Gateway needs addresses of its own") in out
    assert ("zones[2].ingress.addresses[0]: 10.0.0.0/29 contains 10.0.0.5, the address of "
            "zones[0].talosAddresses[0]: the pool must be free addresses") in out
    assert parse(stack(lb("192.0.2.0/28"), lb("192.0.2.16/28"))).zones[1].ingress.addresses == ("192.0.2.16/28",)


def test_rfc2136_needs_server_and_a_known_key():
    rfc = {"dns": {"mode": "rfc2136"}}
    out = problems(stack(rfc))
    assert "zones[0].dns.server: required with mode: rfc2136" in out
    assert "zones[0].dns.keyName: required with mode: rfc2136" in out
    rfc = {"dns": {"mode": "rfc2136", "server": "192.0.2.53", "keyName": "updater"}}
    assert any(p.startswith("zones[0].dns.keyName: kontinuum:dnsTsigKeys is not set") for p in problems(stack(rfc)))
    rfc["dns"]["keyName"] = "other"
    assert "zones[0].dns.keyName: no key 'other' in kontinuum:dnsTsigKeys (it defines updater)" in problems(
        stack(rfc, dnsTsigKeys=KEYS))
    rfc["dns"].update(keyName="updater", zone="example.org")
    assert "zones[0].dns.zone: example.org does not hold the zone host z0.eu.example.com" in problems(
        stack(rfc, dnsTsigKeys=KEYS))
    del rfc["dns"]["zone"]
    cfg = parse(stack(rfc, dnsTsigKeys=KEYS))
    assert cfg.tsig_keys["updater"].algorithm == "hmac-sha256" and cfg.zones[0].dns.server == "192.0.2.53"


def test_manual_dns_refuses_rfc2136_settings_and_bad_keys_do_not_leak():
    out = problems(stack({"dns": {"server": "192.0.2.53"}}, dnsTsigKeys='key "k" { algorithm hmac-sha256; secret "%%"; };'))
    assert "zones[0].dns.server: only for mode: rfc2136; remove it or set zones[0].dns.mode: rfc2136" in out
    assert "kontinuum:dnsTsigKeys: key 'k': `secret` is not base64" in out and not any("%%" in p for p in out)


def test_tsig_keys_plain_text_is_refused_and_the_offline_check_accepts_the_secret():
    raw = stack({"dns": {"mode": "rfc2136", "server": "192.0.2.53", "keyName": "updater"}}, dnsTsigKeys=KEYS)
    out = [str(e) for e in validate(raw, secret_keys=frozenset(), render=False).errors]
    assert any(p.startswith("kontinuum:dnsTsigKeys: is plain text in the stack config") for p in out)
    raw["dnsTsigKeys"] = "<secret>"
    assert validate(raw, secret_keys=frozenset({"dnsTsigKeys"}), render=False).errors == []


def test_acme_ca_bundle_must_be_pem():
    ca = pki.new_ca(common_name="private acme")
    good = parse({**stack(), "hub": {**HUB, "acme": {**HUB["acme"], "caBundle": ca.crt.decode()}}})
    assert good.hub.acme_ca_bundle == ca.crt.decode()
    bad = problems({**stack(), "hub": {**HUB, "acme": {**HUB["acme"], "caBundle": "not a cert"}}})
    assert any(p.startswith("hub.acme.caBundle: must be PEM certificates") for p in bad)
