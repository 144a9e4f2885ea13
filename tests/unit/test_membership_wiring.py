"""The member set reaches the Gateway wait (issue 27), under Pulumi's mocks: a real Zone
component (TalosCluster → Zone → DownstreamFootprint → Exposure → GatewayAddress) before and
after a worker is replaced by its spare, and a loadBalancer zone that membership does not touch.
The mocked wait answers with the members it was given, so the DNS instructions show what follows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CP, LEFT, SPARE = "127.0.0.10", "127.0.0.12", "127.0.0.11"

_PROGRAM = textwrap.dedent('''
    import json, sys
    import pulumi

    inputs, bundle = {}, {}

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            outs = dict(args.inputs)
            if args.typ.endswith(":TalosSecrets"):  # machine configs render from a real bundle
                from providers.talos_secrets import TalosSecretsProvider
                bundle or bundle.update(TalosSecretsProvider().create(dict(args.inputs)).outs)
                outs.update(bundle)
            if args.typ.endswith(":Kubeconfig"):
                outs["kubeconfig"] = "apiVersion: v1\\nkind: Config\\nclusters: []\\n"
            if args.typ == "kubernetes:helm.sh/v3:Release":
                outs["status"] = {"revision": 1}
            if args.typ.endswith(":GatewayAddress"):  # the wait answers with the members' Nodes
                outs["addresses"] = args.inputs.get("members") or ["127.0.0.200"]
            inputs[args.name] = args.inputs
            return [args.name + "-id", outs]

        def call(self, args):
            return {}

    pulumi.runtime.set_mocks(Mocks(), project="kontinuum", stack="test", preview=False)

    import pulumi_kubernetes as k8s
    from kontinuum.stackconfig.parse import parse
    from kontinuum_components.zone import Zone

    hub = k8s.Provider("hub", kubeconfig="hub")
    zones = {}
    for config in json.loads(sys.argv[1]):  # one stack config each: zones may not share machines
        stack = parse(config)
        z = stack.zones[0]
        zones[z.zone] = Zone(f"eu-{z.zone}", region="eu", hub=stack.hub, zone=z, hub_kubeconfig="hub",
                             hub_provider=hub, path="zones[0]")

    @pulumi.runtime.test
    def run():
        names = sorted(zones)
        return pulumi.Output.all(*[pulumi.Output.all(zones[n].cluster.member_addresses, zones[n].addresses,
                                                     zones[n].dns_records) for n in names]).apply(
            lambda got: print("RESULT " + json.dumps({"zones": dict(zip(names, got)), "inputs": inputs},
                                                     default=str)))

    run()
''')


def _zone(name: str, machines: list, **extra) -> dict:
    return {"zone": name, "talosAddresses": machines, "workers": [{"name": "w", "replicas": 1}], "serverImage": "k:1",
            **extra}


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("wiring")
    bundle = tmp / "gateway-api.yaml"  # a local Gateway API bundle: the program fetches nothing
    bundle.write_text("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
                      "metadata: {name: gateways.gateway.networking.k8s.io}\n"
                      "spec: {group: gateway.networking.k8s.io, names: {kind: Gateway, plural: gateways}, "
                      "scope: Namespaced, versions: []}\n")
    addons = {"addons": {"gatewayApi": {"source": str(bundle)}}}
    worker = lambda a: {"address": a, "pool": "w"}  # noqa: E731
    hub = {"dnsDomain": "lab.test", "grpcEndpoint": "hub.lab.test:8443", "acme": {"email": "ops@lab.test"},
           "auth": {"mode": "anonymous"}}
    configs = [{"region": "eu", "hub": hub, "zones": [z]} for z in (
        _zone("before", [CP, worker(LEFT), worker(SPARE)], **addons),  # LEFT serves, SPARE waits
        _zone("after", [CP, worker(SPARE)], **addons),  # LEFT replaced by its spare
        _zone("lb", [CP, worker(LEFT)], ingress={"mode": "loadBalancer", "addresses": ["127.0.0.200/32"]}, **addons),
        _zone("lost", [CP, {**worker(LEFT), "lost": True}, worker(SPARE)], **addons))]  # LEFT declared dead
    prog = tmp / "program.py"
    prog.write_text(_PROGRAM)
    out = subprocess.run([sys.executable, str(prog), json.dumps(configs)], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, f"mock program failed:\n{out.stdout}\n{out.stderr[-4000:]}"
    return json.loads(line[len("RESULT "):])


def test_the_gateway_wait_gets_the_current_members_and_the_records_follow(program):
    zones, inputs = program["zones"], program["inputs"]
    assert zones["before"][0] == [CP, LEFT] and inputs["eu-before-gateway-address"]["members"] == [CP, LEFT]
    assert zones["after"][0] == [CP, SPARE] and inputs["eu-after-gateway-address"]["members"] == [CP, SPARE]
    # The zone's addresses output and its DNS instructions hold the spare, not the machine that left.
    members, addresses, records = zones["after"]
    assert addresses == [CP, SPARE] and records == [f"after.eu.lab.test. 300 IN A {a}" for a in (CP, SPARE)]


def test_a_load_balancer_zone_takes_no_member_set(program):
    assert program["inputs"]["eu-lb-gateway-address"].get("members") is None
    assert program["zones"]["lb"][1] == ["127.0.0.200"]


def test_a_lost_machine_is_named_only_by_its_instance_and_the_zone_s_lost_machines(program):
    """Nothing day 2 runs (config applies, Talos and Kubernetes rollouts, CA rotation, the health
    check, the Gateway wait) ever gets a machine declared lost: its spare takes its place."""
    from kontinuum.naming import instance_name

    naming = {name for name, given in program["inputs"].items() if name.startswith("eu-lost") and LEFT in json.dumps(given)}
    lost = instance_name("eu", "lost", LEFT)
    assert naming == {lost, "eu-lost-lost-machines"}, naming
    assert program["inputs"][lost]["labels"]["kontinuum.sh/lost"] == "true"
    assert program["inputs"]["eu-lost-lost-machines"]["lost"] == [
        {"name": lost, "address": LEFT, "role": "worker", "path": "zones[0].talosAddresses[1]"}]
    assert program["zones"]["lost"][0] == [CP, SPARE]
