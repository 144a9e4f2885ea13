"""Zone exposure and DNS under the real engine on the embedded lab (issue 16), on 127.0.40.0/24.

One lab, one stack, two zones brought up together (`--continue-on-error`, so one zone's failure
does not cut the other short):
- zone a in host-network mode (the default), its record kept by RFC 2136 on a real Knot DNS server;
- zone c with mode loadBalancer and no pool: nothing gives its Gateway an address, so its up
  fails within the gateway bound, saying so and which setting to choose. The operator then adds
  a pool with a fixed address (and keeps manual DNS): the next up makes it Ready there.
The lab's Gateway stand-in plays Cilium and Envoy (lab/standins/gateway.py); addresses are real
loopback sockets that answer HTTP.
"""

from __future__ import annotations

import base64
import http.client
import json
import time

import pytest
import yaml

from lab.knot import KnotServer
from lab.pulumi_cli import Stack
from tests.e2e.labs import running_lab
from tests.e2e.test_zones_engine import lab_config, new_stack, output_text, write_config

FIRST, HUB_ADDRESS, NODES = "127.0.40.11", "127.0.0.40", 2
ADDRESSES = [f"127.0.40.{11 + i}" for i in range(NODES)]
DNS_ADDRESS, DNS_PORT, DNS_ZONE = "127.0.40.201", 53, "lab.kontinuum.test"
TSIG_SECRET = base64.b64encode(b"e2e-exposure-tsig-secret-32byte!").decode()
TSIG_KEYS = f'key "kontinuum-e2e" {{\n\talgorithm hmac-sha256;\n\tsecret "{TSIG_SECRET}";\n}};\n'
GATEWAY_BOUND = 20  # seconds, zone c's gateway wait
UP_TIMEOUT = 600

ZONE_A = {"zone": "a", "talosAddresses": [ADDRESSES[0]],
          "dns": {"mode": "rfc2136", "server": f"{DNS_ADDRESS}:{DNS_PORT}", "zone": DNS_ZONE,
                  "keyName": "kontinuum-e2e", "ttl": 120}}
ZONE_C = {"zone": "c", "talosAddresses": [ADDRESSES[1]], "ingress": {"mode": "loadBalancer"}}
ZONE_C_POOL = {**ZONE_C, "ingress": {"mode": "loadBalancer", "addresses": ["127.0.40.100-127.0.40.103"],
                                     "address": "127.0.40.102", "interfaces": ["^lo$"]}}


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("exposure-lab"), nodes=NODES, first_address=FIRST,
                     hub_address=HUB_ADDRESS) as state:
        yield state


@pytest.fixture(scope="module")
def dns_server(tmp_path_factory):
    server = KnotServer(tmp_path_factory.mktemp("knot"), address=DNS_ADDRESS, port=DNS_PORT, zone=DNS_ZONE,
                        key_name="kontinuum-e2e", key_secret=TSIG_SECRET).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(lab, dns_server, tmp_path_factory):
    stack = new_stack(tmp_path_factory.mktemp("stack"), "exposure", lab_config(lab, [ZONE_A, ZONE_C],
                                                                               gateway=GATEWAY_BOUND))
    stack.set_config("kontinuum:dnsTsigKeys", TSIG_KEYS, secret=True)
    yield stack
    stack.run("destroy", "--yes", "--skip-preview", timeout=UP_TIMEOUT, check=False)


def _http(address: str, host: str) -> tuple[int, str]:
    """Status and Server header of GET / on port 80 (the Gateway's HTTP listener)."""
    conn = http.client.HTTPConnection(address, 80, timeout=5)
    try:
        conn.request("GET", "/", headers={"Host": host})
        r = conn.getresponse()
        return r.status, r.getheader("Server", "").split("/")[0]
    finally:
        conn.close()


def stack_secret(stack: Stack) -> dict:
    """The encrypted kontinuum:dnsTsigKeys entry of the stack's config file, to carry over an edit."""
    return yaml.safe_load(stack.config_file.read_text())["config"]["kontinuum:dnsTsigKeys"]


def test_zone_without_exposure_fails_within_its_bound_naming_the_setting(stack, dns_server):
    t0 = time.monotonic()
    result = stack.run("up", "--yes", "--skip-preview", "--continue-on-error", timeout=UP_TIMEOUT, check=False)
    text = output_text(result)
    print(f"first up: {time.monotonic() - t0:.0f} s")
    assert result.returncode != 0
    assert f"Gateway kontinuum-system/kontinuum has no address after {GATEWAY_BOUND} s" in text, text[-4000:]
    assert "AddressNotAssigned" in text and "no_pool" in text
    assert "zones[1].ingress: mode loadBalancer without addresses" in text
    assert "set zones[1].ingress.addresses" in text and "mode: hostNetwork" in text
    assert "lab-c-certificate-ready" not in text  # it failed before the certificate wait
    # Zone a went on: host network, its node's address, published by RFC 2136.
    resources = {r["urn"].rsplit("::", 1)[-1]: r for r in stack.export()["deployment"]["resources"]}
    assert resources["lab-a-gateway-address"]["outputs"]["addresses"] == [ADDRESSES[0]]
    assert "lab-a-certificate-ready" in resources and "lab-c-certificate-ready" not in resources
    assert dns_server.lookup(f"a.{DNS_ZONE}.") == [ADDRESSES[0]]
    # Envoy answers there; its HTTP listener only carries ACME challenge routes (the server's
    # route is on HTTPS), so / is Envoy's 404.
    assert _http(ADDRESSES[0], f"a.{DNS_ZONE}") == (404, "envoy")


def test_a_pool_with_a_fixed_address_makes_the_zone_ready_there(lab, stack, dns_server):
    write_config(stack, {**lab_config(lab, [ZONE_A, ZONE_C_POOL], gateway=GATEWAY_BOUND),
                         "kontinuum:dnsTsigKeys": stack_secret(stack)})
    t0 = time.monotonic()
    text = output_text(stack.up(timeout=UP_TIMEOUT))
    print(f"second up: {time.monotonic() - t0:.0f} s")
    zones = stack.outputs()["zones"]
    assert {z: zones[z]["ready"] for z in zones} == {"a": True, "c": True}
    assert zones["a"]["addresses"] == [ADDRESSES[0]] and zones["c"]["addresses"] == ["127.0.40.102"]
    assert zones["a"]["dns"] == {"mode": "rfc2136", "records": [f"a.{DNS_ZONE}. 120 IN A {ADDRESSES[0]}"]}
    assert zones["c"]["dns"] == {"mode": "manual", "records": [f"c.{DNS_ZONE}. 300 IN A 127.0.40.102"]}
    assert f"create this DNS record so that c.{DNS_ZONE} reaches the Gateway" in text
    assert dns_server.lookup(f"c.{DNS_ZONE}.") == []  # manual: nobody wrote it
    assert _http("127.0.40.102", f"c.{DNS_ZONE}") == (404, "envoy")
    assert TSIG_SECRET not in text and TSIG_SECRET not in json.dumps(stack.export())


def test_destroy_deletes_the_record(stack, dns_server):
    stack.destroy(timeout=UP_TIMEOUT)
    assert dns_server.lookup(f"a.{DNS_ZONE}.") == []
