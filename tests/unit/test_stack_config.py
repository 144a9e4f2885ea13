"""Stack config validation: every problem reported at once, each with its path."""

import pytest

from kontinuum.errors import ConfigErrors
from kontinuum_components.config import parse

HUB = {"dnsDomain": "example.com", "grpcEndpoint": "hub.example.com:443",
       "acme": {"email": "ops@example.com"}, "auth": {"mode": "anonymous"}}


def good(**zone):
    return {"region": "eu", "hub": HUB, "zones": [{"zone": "eu-1a", "talosAddresses": ["10.0.0.5"], **zone}]}


def problems(raw) -> list[str]:
    with pytest.raises(ConfigErrors) as e:
        parse(raw)
    return [str(x) for x in e.value.errors]


def test_minimal_zone_gets_defaults():
    cfg = parse(good())
    z = cfg.zones[0]
    assert (cfg.region, z.zone, z.control_plane.replicas, z.workers) == ("eu", "eu-1a", 1, ())
    assert z.machines[0].addresses == ("10.0.0.5",) and z.machines[0].pool == "controlplane"
    assert z.addons.cilium.source.repo == "https://helm.cilium.io/"
    assert z.timeouts["health"] == 900 and not z.skip_unreachable_cluster


def test_control_plane_replicas_must_be_odd_small():
    assert "zones[0].controlPlane.replicas: must be 1, 3 or 5, got 2" in problems(good(controlPlane={"replicas": 2}))


def test_several_control_planes_need_an_endpoint():
    out = problems(good(controlPlane={"replicas": 3}))
    assert any(p.startswith("zones[0].controlPlane.endpoint: required with several control planes") for p in out)


def test_all_problems_reported_together_with_paths():
    raw = good(controlPlane={"replicas": 4, "endpoint": "http://x"}, workers=[{"name": "W!", "replicas": -1}],
               talosAddresses=["10.0.0.5", {"address": "10.0.0.6", "pool": "gpu"}], kubernetesVersion="1.35")
    raw["hub"] = {**HUB, "grpcEndpoint": "grpc://hub"}
    out = problems(raw)
    for expected in [
        "zones[0].controlPlane.replicas: must be 1, 3 or 5, got 4",
        "zones[0].controlPlane.endpoint: must be https://host:port",
        "zones[0].workers[0].name: must be lowercase",
        "zones[0].workers[0].replicas: must be a whole number >= 0, got -1",
        "zones[0].talosAddresses[1].pool: unknown pool 'gpu'",
        "zones[0].kubernetesVersion: must look like v1.2.3, got '1.35'",
        "hub.grpcEndpoint: must be host:port (no scheme)",
    ]:
        assert any(p.startswith(expected) for p in out), (expected, out)


def test_zone_refused_without_hub_auth():
    raw = good()
    raw["hub"] = {k: v for k, v in HUB.items() if k != "auth"}
    assert any(p.startswith("hub.auth: not configured: a zone's kontinuum-server refuses to start") for p in problems(raw))


def test_duplicate_zones_and_shared_addresses_are_errors():
    raw = good()
    raw["zones"].append({"zone": "eu-1a", "talosAddresses": ["10.0.0.5"]})
    out = problems(raw)
    assert "zones[1].zone: zone 'eu-1a' is listed twice" in out
    assert any(p.startswith("zones[1].talosAddresses: 10.0.0.5 is already used by zone eu-1a") for p in out)


def test_defaults_merge_under_zones():
    raw = good()
    raw["defaults"] = {"kubernetesVersion": "v1.34.4", "timeouts": {"health": 60},
                       "addons": {"cilium": {"chart": {"path": "lab/charts/cilium"}}}}
    z = parse(raw).zones[0]
    assert z.kubernetes_version == "v1.34.4" and z.timeouts["health"] == 60
    assert z.addons.cilium.source.path == "lab/charts/cilium" and z.addons.cilium.source.namespace == "kube-system"


def test_oidc_needs_issuer_and_client():
    raw = good()
    raw["hub"] = {**HUB, "auth": {"mode": "oidc", "oidc": {"issuerUrl": "http://idp"}}}
    out = problems(raw)
    assert "hub.auth.oidc.clientId: required" in out
    assert any(p.startswith("hub.auth.oidc.issuerUrl: must be an https URL") for p in out)


@pytest.mark.parametrize("stack_file", ["Pulumi.lab.yaml", "Pulumi.example-eu.yaml"])
def test_shipped_stacks_are_valid(stack_file):
    from pathlib import Path

    import yaml

    from kontinuum_components.specs import validate

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "stacks" / stack_file).read_text())["config"]
    cfg = parse({k.split(":", 1)[1]: v for k, v in raw.items()})
    for i, z in enumerate(cfg.zones):
        validate(f"{cfg.region}-{z.zone}", z, f"zones[{i}].")
