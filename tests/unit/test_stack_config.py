"""Stack config validation: every problem reported at once, each with its path."""

import pytest

from kontinuum.errors import ConfigErrors
from kontinuum.stackconfig.parse import parse

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
        "hub.grpcEndpoint: must be host:port with a numeric port (no scheme)",
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
    assert "zones[1].zone: zone 'eu-1a' is listed twice (also zones[0])" in out
    assert "zones[1].talosAddresses[0]: 10.0.0.5 is already used by zones[0].talosAddresses[0] (zone eu-1a)" in out


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

    from kontinuum.stackconfig.specs import validate

    from lab import upstream
    from lab.acme import ensure_ca

    root = Path(__file__).resolve().parents[2]
    upstream.link(root / ".state" / "lab" / "upstream")  # the lab stack names the pinned charts there
    ensure_ca(root / ".state" / "lab" / "acme")  # and the lab ACME server's CA file
    raw = yaml.safe_load((root / "stacks" / stack_file).read_text())["config"]
    cfg = parse({k.split(":", 1)[1]: v for k, v in raw.items()})
    for i, z in enumerate(cfg.zones):
        validate(f"{cfg.region}-{z.zone}", z, f"zones[{i}].")


# --- the contract: unknown keys, wrong types, values, all at once ------------------------------

import copy  # noqa: E402

from kontinuum.stackconfig import contract, schema  # noqa: E402

FULL = {
    "region": "eu",
    "hubKubeconfigFile": "hub.yaml",
    "hub": {"dnsDomain": "example.com", "grpcEndpoint": "hub.example.com:443",
            "acme": {"email": "ops@example.com", "server": "https://acme.example.com/dir"},
            "auth": {"mode": "oidc", "oidc": {"issuerUrl": "https://idp.example.com", "clientId": "k"}}},
    "defaults": {"timeouts": {"health": 60}},
    "allowEmptyRegion": False,
    "zones": [{
        "zone": "eu-1a",
        "talosAddresses": ["10.0.0.5", "10.0.0.6", "10.0.0.7",
                           {"addresses": ["10.0.1.21", "node-21.example.com"], "pool": "general"}],
        "controlPlane": {"replicas": 3, "endpoint": "https://10.0.0.10:6443", "installDisk": "/dev/vda",
                         "nodeLabels": {"a": "b"}, "patches": [{"machine": {}}]},
        "workers": [{"name": "general", "replicas": 1, "installDisk": "/dev/vda", "nodeLabels": {}, "patches": []}],
        "patches": [[{"op": "add", "path": "/machine/time", "value": {"servers": ["time.example.com"]}}]],
        "talosVersion": "v1.13.0", "kubernetesVersion": "v1.35.4",
        "addons": {"cilium": {"chart": {"repo": "https://r", "chart": "c", "version": "1", "namespace": "n"},
                              "values": {}},
                   "certManager": {"chart": {"path": "lab/charts/cert-manager-standin"}, "values": {}},
                   "gatewayApi": {"source": "lab/kwok/stages.yaml"}},  # any local YAML file
        "serverImage": "img:1", "unregisterInstancesOnDelete": True,
        "teardown": {"skipUnreachableCluster": False, "wipe": "disk"},
        "timeouts": {"apply": 60}, "talosPort": 50000,
    }],
}

WRONG = {"string": 12345, "integer": "5", "number": True, "boolean": "yes", "object": "text", "array": {"a": 1},
         "union": 4.5, "any": None}


def _set(raw: dict, path: str, value) -> str:
    """Set `a.b[].c` (first list item) in raw; returns the concrete path (`a.b[0].c`)."""
    node, parts = raw, path.replace("[]", ".[]").split(".")
    for i, part in enumerate(parts[:-1]):
        kind = list if parts[i + 1] == "[]" else dict
        if part == "[]":
            if not isinstance(node[0], kind):
                node[0] = kind()
            node = node[0]
        else:
            node = node.setdefault(part, kind())
        if isinstance(node, list) and not node:
            node.append({})
    last = parts[-1]
    if last == "[]":
        node[0] = value
    else:
        node[last] = value
    return path.replace("[]", "[0]")


DOCUMENTED = [(p, f) for p, f in schema.rows(contract.STACK, every=True) if f.type != "any"]


def test_full_example_is_valid():
    stack = parse(copy.deepcopy(FULL))
    z = stack.zones[0]
    assert z.machines[3].addresses == ("10.0.1.21", "node-21.example.com") and z.teardown_wipe == "disk"
    assert z.timeouts["health"] == 60 and z.timeouts["apply"] == 60 and stack.hub.auth.mode == "oidc"


@pytest.mark.parametrize("path,field", DOCUMENTED, ids=[p for p, _ in DOCUMENTED])
def test_every_documented_key_rejects_a_wrong_typed_value_by_path(path, field):
    raw = copy.deepcopy(FULL)
    where = _set(raw, path, WRONG[field.type])
    out = problems(raw)
    assert any(p.startswith(f"{where}: must be ") and "got " in p for p in out), (where, out)


@pytest.mark.parametrize("path,value,expected", [
    ("zones[].talosPort", 70000, "must be a whole number between 1 and 65535, got 70000"),
    ("zones[].talosPort", 0, "must be a whole number between 1 and 65535, got 0"),
    ("zones[].timeouts.health", -1, "must be a number >= 0, got -1"),
    ("zones[].timeouts.health", True, "must be a number, got a boolean (true)"),
    ("zones[].talosAddresses", "10.0.0.5", "must be a list, got a string ('10.0.0.5')"),
    ("zones[].workers", {"name": "w"}, "must be a list, got a mapping"),
    ("zones[].controlPlane", ["x"], "must be a mapping, got a list"),
    ("zones[].controlPlane.replicas", True, "must be a whole number, got a boolean (true)"),
    ("zones[].teardown.wipe", "all", "must be state or disk, got 'all'"),
    ("hub", "example.com", "must be a mapping, got a string ('example.com')"),
    ("zones", "eu-1a", "must be a list, got a string ('eu-1a')"),
    ("defaults", ["x"], "must be a mapping, got a list"),
])
def test_wrong_shapes_name_the_path(path, value, expected):
    raw = copy.deepcopy(FULL)
    where = _set(raw, path, value)
    assert f"{where}: {expected}" in problems(raw)


@pytest.mark.parametrize("path,value,expected", [
    ("zones[].talosAddresses[]", "10.0.0.5/24", "must be an IPv4/IPv6 address or an RFC 1123 host name"),
    ("zones[].talosAddresses[]", "bad_host!", "must be an IPv4/IPv6 address or an RFC 1123 host name"),
    ("zones[].talosAddresses[]", "999.1.1.1", "must be an IPv4/IPv6 address or an RFC 1123 host name"),
    ("zones[].controlPlane.endpoint", "https://10.0.0.10", "must be https://host:port"),
    ("zones[].controlPlane.endpoint", "https://10.0.0.10:99999",
     "must be https://host:port (e.g. https://10.0.0.5:6443) with a port between 1 and 65535"),
    ("zones[].controlPlane.endpoint", "http://10.0.0.10:6443", "must be https://host:port"),
    ("hub.acme.server", "http://acme.example.com/dir", "must be an https URL"),
    ("hub.acme.email", "ops-at-example", "must be an e-mail address"),
    ("hub.dnsDomain", "bad domain", "must be a DNS name"),
    ("hub.grpcEndpoint", "hub.example.com:https", "must be host:port with a numeric port"),
    ("hub.grpcEndpoint", "hub.example.com", "must be host:port with a numeric port"),
    ("zones[].kubernetesVersion", "1.35", "must look like v1.2.3"),
])
def test_values_are_validated_for_what_they_are(path, value, expected):
    raw = copy.deepcopy(FULL)
    where = _set(raw, path, value)
    assert any(p.startswith(f"{where}: {expected}") for p in problems(raw)), problems(raw)


def test_ipv6_and_host_names_are_addresses():
    raw = copy.deepcopy(FULL)
    raw["zones"][0]["talosAddresses"][:3] = ["fd00::5", "node-6.example.com", "10.0.0.7"]
    raw["hub"]["grpcEndpoint"] = "[fd00::1]:443"
    assert parse(raw).zones[0].machines[0].addresses == ("fd00::5",)


@pytest.mark.parametrize("path,typo,suggestion", [
    ("", "zone", "kontinuum:zones"),
    ("hub", "dnsDomian", "dnsDomain"),
    ("hub.acme", "emial", "email"),
    ("defaults", "kubernetesVerison", "kubernetesVersion"),
    ("zones[]", "talosVerison", "talosVersion"),
    ("zones[].controlPlane", "replica", "replicas"),
    ("zones[].workers[]", "instalDisk", "installDisk"),
    ("zones[].addons", "certmanager", "certManager"),
    ("zones[].addons.cilium.chart", "verison", "version"),
    ("zones[].timeouts", "helath", "health"),
    ("zones[].teardown", "skipUnreachable", "skipUnreachableCluster"),
    ("zones[].talosAddresses[]", "adress", "address"),
    ("zones[].patches[][]", "vaule", "value"),
])
def test_unknown_keys_are_errors_with_the_nearest_key(path, typo, suggestion):
    raw = copy.deepcopy(FULL)
    if path == "zones[].talosAddresses[]":
        raw["zones"][0]["talosAddresses"][3][typo] = "x"
        where = "zones[0].talosAddresses[3]"
    elif path == "zones[].patches[][]":
        raw["zones"][0]["patches"][0][0][typo] = "x"
        where = "zones[0].patches[0][0]"
    elif path:
        node = raw
        for part in path.replace("[]", ".[]").split("."):
            node = node[0] if part == "[]" else node[part]
        node[typo] = "x"
        where = path.replace("[]", "[0]")
    else:
        raw[typo] = "x"
        where = "kontinuum"
    sep = ":" if not path else "."
    assert f"{where}{sep}{typo}: unknown key; did you mean {suggestion}?" in problems(raw)


def test_a_top_level_typo_is_never_an_empty_region():
    raw = copy.deepcopy(FULL)
    raw["zone"] = raw.pop("zones")
    assert problems(raw) == ["kontinuum:zone: unknown key; did you mean kontinuum:zones?"]


def test_problems_everywhere_are_reported_at_once_and_defaults_once():
    raw = copy.deepcopy(FULL)
    raw["defaults"] = {"talosPort": "x", "timeouts": {"helth": 5}}
    second = copy.deepcopy(raw["zones"][0])
    second.update(zone="eu-1b", talosAddresses=["10.0.9.1"], controlPlane={"replicas": 1}, workers=[{"name": "g", "replicas": "2"}])
    raw["zones"].append(second)
    raw["zones"][0]["controlPlane"]["replicas"] = 2
    raw["hub"]["acme"]["email"] = "nope"
    out = problems(raw)
    assert out.count("defaults.talosPort: must be a whole number, got a string ('x')") == 1
    assert out.count("defaults.timeouts.helth: unknown key; did you mean health?") == 1
    for expected in ["zones[0].controlPlane.replicas: must be 1, 3 or 5, got 2",
                     "zones[1].workers[0].replicas: must be a whole number, got a string ('2')",
                     "hub.acme.email: must be an e-mail address, got 'nope'"]:
        assert expected in out, out
    assert not any(p.startswith("zones[") and "talosPort" in p for p in out)


def test_replicas_cannot_exceed_the_machines_listed_for_the_pool():
    raw = copy.deepcopy(FULL)
    raw["zones"][0]["workers"][0]["replicas"] = 2
    raw["zones"][0]["controlPlane"]["replicas"] = 5
    out = problems(raw)
    assert "zones[0].controlPlane.replicas: 5 wanted but zones[0].talosAddresses lists 3 machines for pool 'controlplane'" in out
    assert "zones[0].workers[0].replicas: 2 wanted but zones[0].talosAddresses lists 1 machine for pool 'general'" in out


def test_any_address_of_a_machine_counts_once_per_stack():
    raw = copy.deepcopy(FULL)
    raw["zones"].append({"zone": "eu-1b", "talosAddresses": [{"addresses": ["10.0.9.9", "node-21.example.com"]}]})
    assert ("zones[1].talosAddresses[0]: node-21.example.com is already used by zones[0].talosAddresses[3] "
            "(zone eu-1a)") in problems(raw)


@pytest.mark.parametrize("talos,kubernetes,path,expected", [
    ("v1.13.0", "v1.30.9", "kubernetesVersion", "Kubernetes v1.30.9 is not supported by Talos v1.13.0 (supported: 1.31–1.36)"),
    ("v1.13.2", "v1.37.0", "kubernetesVersion", "Kubernetes v1.37.0 is not supported by Talos v1.13.2 (supported: 1.31–1.36)"),
    ("v1.12.0", "v1.35.0", "talosVersion", "Talos v1.12.0 is not supported: machine configs follow the pinned contract (v1.13.x)"),
])
def test_only_supported_version_pairs(talos, kubernetes, path, expected):
    raw = copy.deepcopy(FULL)
    raw["zones"][0].update(talosVersion=talos, kubernetesVersion=kubernetes)
    assert f"zones[0].{path}: {expected}" in problems(raw)


@pytest.mark.parametrize("kubernetes", ["v1.31.0", "v1.36.3"])
def test_supported_range_edges_are_accepted(kubernetes):
    raw = copy.deepcopy(FULL)
    raw["zones"][0]["kubernetesVersion"] = kubernetes
    assert parse(raw).zones[0].kubernetes_version == kubernetes


def test_plain_text_hub_kubeconfig_is_refused_with_the_command():
    raw = {**copy.deepcopy(FULL), "hubKubeconfig": "apiVersion: v1"}
    assert ("kontinuum:hubKubeconfigFile: set either kontinuum:hubKubeconfig (a secret) or "
            "kontinuum:hubKubeconfigFile, not both") in problems_with(raw, secret_keys=frozenset({"hubKubeconfig"}))
    del raw["hubKubeconfigFile"]
    out = problems_with(raw, secret_keys=frozenset())
    assert any(p.startswith("kontinuum:hubKubeconfig: is plain text in the stack config; store it as a secret") and
               "pulumi config set --secret kontinuum:hubKubeconfig < hub-kubeconfig.yaml" in p for p in out), out
    assert "apiVersion" not in "".join(out)  # the value itself is never echoed
    parse(raw, secret_keys=frozenset({"hubKubeconfig"}))


def problems_with(raw, **kw) -> list[str]:
    with pytest.raises(ConfigErrors) as e:
        parse(raw, **kw)
    return [str(x) for x in e.value.errors]


# --- a config that lost every zone ---------------------------------------------------------

from providers.region_guard import RegionGuardProvider  # noqa: E402


@pytest.mark.parametrize("olds,news,refused", [
    ({"zones": ["a", "b"]}, {"region": "eu", "zones": [], "allowEmpty": False}, True),
    ({"zones": ["a", "b"]}, {"region": "eu", "zones": ["a"], "allowEmpty": False}, False),
    ({"zones": ["a"]}, {"region": "eu", "zones": [], "allowEmpty": True}, False),
    ({}, {"region": "eu", "zones": [], "allowEmpty": False}, False),
    ({"zones": []}, {"region": "eu", "zones": [], "allowEmpty": False}, False),
])
def test_region_guard_refuses_only_an_emptied_region(olds, news, refused):
    failures = RegionGuardProvider().check(olds, news).failures
    assert bool(failures) == refused
    if refused:
        assert failures[0].property == "zones"
        assert "pulumi destroy" in failures[0].reason and "kontinuum:allowEmptyRegion: true" in failures[0].reason
        assert "zones a, b" in failures[0].reason


def test_allow_empty_region_is_part_of_the_contract():
    raw = copy.deepcopy(FULL)
    raw.update(zones=[], allowEmptyRegion=True)
    assert parse(raw).allow_empty_region is True
    raw["allowEmptyRegion"] = "yes"
    assert "allowEmptyRegion: must be true or false, got a string ('yes')" in problems(raw)


@pytest.mark.parametrize("path,expected", [
    ("region", "kontinuum:region: required"),
    ("hub", "hub: required: dnsDomain, grpcEndpoint, acme and auth of the hub"),
    ("zones[].zone", "zones[0].zone: required"),
    ("zones[].talosAddresses", "zones[0].talosAddresses: required"),
    ("hub.acme.email", "hub.acme.email: required"),
])
def test_an_empty_yaml_value_of_a_required_key_is_missing_not_silently_dropped(path, expected):
    raw = copy.deepcopy(FULL)
    _set(raw, path, None)
    assert expected in problems(raw)
