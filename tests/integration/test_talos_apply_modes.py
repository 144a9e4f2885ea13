"""Live or reboot, over real gRPC with our Talos client: the emulator decides per applied config
as Talos 1.13 does (lab/talos_node/apply_decision.py), so auto reboots only for a change that
needs it, no-reboot refuses such a change, and a dry run answers the mode and changes nothing.
Nodes come from 127.0.61.0/24, one Lab per test."""

from __future__ import annotations

import pytest
import yaml
from grpclib.const import Status

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import ClusterSpec
from kontinuum.talos.errors import NeedsRebootError, TalosApiError
from lab.talos_node import Lab
from lab.talos_node.api import NodeApi
from lab.talos_node.call import Call
from protos.gen.machine import machine_pb2

POOL = "127.0.61.0/24"
UP = 10.0  # bound for a node to come back from a reboot
ENV = {"HTTP_PROXY": "http://proxy.example.test:3128"}  # machine.env: applied at boot only
LABELS = {"example.test/rack": "r1"}  # machine.nodeLabels: applied live


@pytest.fixture(scope="module")
def bundle() -> secrets.SecretsBundle:
    return secrets.generate()


@pytest.fixture(params=["v1.13.0"])
def node_and_client(request, bundle):
    with Lab(reboot_delay=0.1, pool=POOL, talos_version=request.param) as lab:
        node = lab.add_node()
        spec = ClusterSpec(name="modes", endpoint=f"https://{node.address}:6443", kubernetes_version="1.34.1")
        config = mc.render(spec, bundle)
        TalosClient.maintenance(node.address).apply_config(config)
        node.wait_for("configured", UP)
        text = talosconfig.render("modes", [node.address], [node.address], bundle.os.crt,
                                  talosconfig.issue_client_cert(bundle.os))
        yield lab, node, TalosClient.from_talosconfig(talosconfig.parse(text)), config


def with_machine(config: bytes | str, **fields) -> str:
    docs = list(yaml.safe_load_all(config))
    doc = next(d for d in docs if isinstance(d, dict) and d.get("version") == "v1alpha1")
    doc["machine"].update(fields)
    return yaml.safe_dump_all(docs, sort_keys=False)


def applies(node) -> list[tuple[str, str]]:
    return [(e["requested"], e["mode"]) for e in node.event_log() if e["event"] == "apply" and e["stage"] == "configured"]


def test_auto_reboots_for_a_change_that_needs_it_and_adopts_the_config(node_and_client):
    _, node, client, config = node_and_client
    boots, boot_id = node.boots, node.boot_id
    result = client.apply_config(with_machine(config, env=ENV))
    assert result.mode == "reboot"
    assert result.details.startswith("Applied configuration with a reboot: this config change can't be applied "
                                     "in immediate mode\ndiff:\n--- a\n+++ b\n")
    assert "HTTP_PROXY" in result.details
    node.wait_for("configured", UP, after_boot=boots)
    assert node.boot_id != boot_id and yaml.safe_load(node.config.raw)["machine"]["env"] == ENV
    assert applies(node) == [("auto", "reboot")]


def test_auto_applies_a_live_change_without_a_reboot(node_and_client):
    _, node, client, config = node_and_client
    boots = node.boots
    result = client.apply_config(with_machine(config, nodeLabels=LABELS))
    assert (result.mode, result.details) == ("no-reboot", "Applied configuration without a reboot")
    assert node.boots == boots and node.mode == "configured"
    assert yaml.safe_load(node.config.raw)["machine"]["nodeLabels"] == LABELS
    assert applies(node) == [("auto", "no-reboot")]


def test_no_reboot_refuses_a_change_that_needs_a_reboot_and_keeps_the_config(node_and_client):
    _, node, client, config = node_and_client
    before, boots = node.config, node.boots
    changed = with_machine(config, env=ENV)
    for dry_run in (True, False):  # a dry run is refused the same way
        with pytest.raises(NeedsRebootError) as err:
            client.apply_config(changed, mode="no-reboot", dry_run=dry_run)
        assert err.value.status is Status.INVALID_ARGUMENT
        # Talos's message goes on with a diff of the whole config (secrets too): the client keeps its first line.
        assert err.value.problem == "INVALID_ARGUMENT: this config change can't be applied in immediate mode"
    assert node.config is before and node.boots == boots and applies(node) == []
    assert client.apply_config(with_machine(config, nodeLabels=LABELS), mode="no-reboot").mode == "no-reboot"


def test_a_dry_run_answers_the_mode_and_the_diff_and_changes_nothing(node_and_client):
    _, node, client, config = node_and_client
    before, boots = node.config, node.boots
    reboot = client.apply_config(with_machine(config, env=ENV), dry_run=True)
    assert reboot.mode == "reboot"
    assert reboot.details.startswith("Dry run summary:\nApplied configuration with a reboot (skipped in dry-run).\n"
                                     "Config diff:\n\n--- a\n+++ b\n")
    assert "immediate mode" not in reboot.details and "+    HTTP_PROXY: http://proxy.example.test:3128" in reboot.details
    live = client.apply_config(with_machine(config, nodeLabels=LABELS), dry_run=True)
    assert live.mode == "no-reboot" and live.details.startswith(
        "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:")
    same = client.apply_config(config, dry_run=True)
    assert same.details.endswith("Config diff:\n\nNo changes.")
    staged = client.apply_config(with_machine(config, env=ENV), mode="staged", dry_run=True)
    assert staged.mode == "staged"
    assert node.config is before and node.staged is None and node.boots == boots and applies(node) == []


@pytest.mark.parametrize("node_and_client", ["v1.13.3"], indirect=True)
def test_from_v1_13_3_a_node_rebooting_for_an_apply_takes_no_further_config(node_and_client):
    lab, node, client, config = node_and_client
    boots = node.boots
    call = Call(frozenset({"os:admin"}))  # the handler on the node's loop, its reboot held back
    request = machine_pb2.ApplyConfigurationRequest(data=with_machine(config, env=ENV).encode(),
                                                    mode=machine_pb2.ApplyConfigurationRequest.REBOOT)
    assert lab._call(NodeApi(node).apply_configuration(call, request)).messages[0].mode == request.mode
    with pytest.raises(TalosApiError) as err:
        client.apply_config(config, dry_run=True)
    assert err.value.status is Status.FAILED_PRECONDITION
    assert "configuration was already applied and node is rebooting" in err.value.problem
    lab._loop.call_soon_threadsafe(call.after_reply[0])
    node.wait_for("configured", UP, after_boot=boots)
    assert client.apply_config(config, dry_run=True).mode == "reboot"  # the env change is in, removing it reboots
