"""Machine configs: contract content, patches, redaction, spec errors and the precheck."""

from __future__ import annotations

import base64
import dataclasses
from pathlib import Path

import pytest
import yaml

from kontinuum.errors import ConfigError, ConfigErrors
from kontinuum.talos import configpatch, machineconfig as mc, secrets
from kontinuum.talos.clusterspec import (
    CONTROLPLANE,
    DEFAULT_INSTALLER_IMAGE,
    TALOS_CONTRACT,
    ClusterSpec,
    NetworkSpec,
    NodeSpec,
    PoolSpec,
    spec_problems,
    validate_spec,
)
from kontinuum.talos.precheck import precheck
from kontinuum.talos.redaction import REDACTED, redact

FIXTURE = Path(__file__).parent / "fixtures" / "talosctl-secrets.yaml"


@pytest.fixture(scope="module")
def bundle() -> secrets.SecretsBundle:
    return secrets.load(FIXTURE.read_text())


def spec(**kw) -> ClusterSpec:
    base = dict(
        name="lab-eu",
        endpoint="https://127.0.0.10:6443",
        kubernetes_version="1.34.1",
        control_plane=PoolSpec(CONTROLPLANE, 3),
        workers=(PoolSpec("general", 2),),
    )
    base.update(kw)
    return ClusterSpec(**base)


def doc(raw: bytes) -> dict:
    return yaml.safe_load(raw)


# --- contract content -----------------------------------------------------------------------


def test_controlplane_carries_what_talosctl_emits_plus_our_choices(bundle):
    cfg = doc(mc.render(spec(cert_sans=("api.lab.test",)), bundle))
    m, c = cfg["machine"], cfg["cluster"]
    assert (cfg["version"], cfg["debug"], cfg["persist"]) == ("v1alpha1", False, True)
    assert m["type"] == "controlplane"
    assert m["token"] == bundle.trustd_token
    assert base64.b64decode(m["ca"]["key"]) == bundle.os.key
    assert m["certSANs"] == ["api.lab.test"]
    assert m["kubelet"]["image"] == "ghcr.io/siderolabs/kubelet:v1.34.1"
    assert m["install"] == {
        "disk": "/dev/sda",
        "image": DEFAULT_INSTALLER_IMAGE,
        "wipe": False,
        "grubUseUKICmdline": True,
    }
    assert m["features"]["kubePrism"] == {"enabled": True, "port": 7445}
    assert m["features"]["hostDNS"] == {"enabled": True, "forwardKubeDNSToHost": True}
    assert m["nodeLabels"] == {"node.kubernetes.io/exclude-from-external-load-balancers": ""}

    assert c["controlPlane"] == {"endpoint": "https://127.0.0.10:6443"}
    assert c["clusterName"] == "lab-eu"
    assert c["network"] == {
        "cni": {"name": "none"},
        "dnsDomain": "cluster.local",
        "podSubnets": ["10.244.0.0/16"],
        "serviceSubnets": ["10.96.0.0/12"],
    }
    assert c["proxy"]["disabled"] is True
    assert c["apiServer"]["certSANs"] == ["127.0.0.10", "api.lab.test"]
    assert c["apiServer"]["image"] == "registry.k8s.io/kube-apiserver:v1.34.1"
    assert (c["id"], c["secret"], c["token"]) == (bundle.cluster_id, bundle.cluster_secret, bundle.bootstrap_token)
    assert c["secretboxEncryptionSecret"] == bundle.secretbox_secret
    for name, ck in (("ca", bundle.k8s), ("aggregatorCA", bundle.k8s_aggregator)):
        assert base64.b64decode(c[name]["crt"]) == ck.crt and base64.b64decode(c[name]["key"]) == ck.key
    assert base64.b64decode(c["serviceAccount"]["key"]) == bundle.k8s_serviceaccount_key
    assert base64.b64decode(c["etcd"]["ca"]["key"]) == bundle.etcd.key
    assert c["discovery"] == {"enabled": True, "registries": {"kubernetes": {"disabled": True}, "service": {}}}
    assert "allowSchedulingOnControlPlanes" not in c


def test_without_workers_control_planes_take_workloads(bundle):
    cfg = doc(mc.render(spec(control_plane=PoolSpec(CONTROLPLANE, 1), workers=()), bundle))
    assert cfg["cluster"]["allowSchedulingOnControlPlanes"] is True
    assert "nodeLabels" not in cfg["machine"]
    zero = doc(mc.render(spec(workers=(PoolSpec("general", 0),)), bundle))
    assert zero["cluster"]["allowSchedulingOnControlPlanes"] is True


def test_workers_never_carry_ca_keys_or_etcd(bundle):
    raw = mc.render(spec(), bundle, pool="general")
    cfg = doc(raw)
    m, c = cfg["machine"], cfg["cluster"]
    assert m["type"] == "worker"
    assert m["ca"] == {"crt": base64.b64encode(bundle.os.crt).decode()}
    assert c["ca"] == {"crt": base64.b64encode(bundle.k8s.crt).decode()}
    for absent in ("aggregatorCA", "serviceAccount", "etcd", "secretboxEncryptionSecret", "apiServer", "proxy"):
        assert absent not in c
    text = raw.decode()
    for key in (bundle.os.key, bundle.k8s.key, bundle.k8s_aggregator.key, bundle.etcd.key, bundle.k8s_serviceaccount_key):
        assert base64.b64encode(key).decode() not in text
    assert bundle.secretbox_secret not in text


def test_unknown_pool_is_an_error(bundle):
    with pytest.raises(ConfigError, match="unknown pool 'gpu'"):
        mc.render(spec(), bundle, pool="gpu")


def test_contract_constant():
    assert TALOS_CONTRACT == "v1.13"


# --- determinism ----------------------------------------------------------------------------


def test_same_inputs_same_bytes(bundle):
    s = spec(
        patches=({"machine": {"sysctls": {"b": "2", "a": "1"}}},),
        control_plane=PoolSpec(CONTROLPLANE, 3, node_labels={"z": "1", "a": "2"}),
    )
    node = NodeSpec("n1", install_disk="/dev/nvme0n1", patches=([{"op": "add", "path": "/machine/certSANs/-", "value": "x"}],))
    first = mc.render(s, bundle, node=node)
    assert first == mc.render(s, bundle, node=node)
    assert first == mc.render(dataclasses.replace(s), secrets.load(FIXTURE.read_text()), node=node)
    assert isinstance(first, bytes)
    labels = list(doc(first)["machine"]["nodeLabels"])
    assert labels == sorted(labels)


# --- patches --------------------------------------------------------------------------------


def test_patches_apply_cluster_then_pool_then_node(bundle):
    def layer(tag):
        return (
            {"machine": {"nodeLabels": {"layer": tag}, "sysctls": {tag: "1"}}},
            [{"op": "add", "path": "/machine/certSANs/-", "value": f"{tag}.lab.test"}],
        )

    s = spec(
        patches=layer("cluster"),
        workers=(PoolSpec("general", 2, patches=layer("pool")),),
    )
    cfg = doc(mc.render(s, bundle, pool="general", node=NodeSpec("w1", patches=layer("node"))))
    assert cfg["machine"]["certSANs"] == ["cluster.lab.test", "pool.lab.test", "node.lab.test"]
    assert cfg["machine"]["nodeLabels"]["layer"] == "node"
    assert list(cfg["machine"]["sysctls"]) == ["cluster", "pool", "node"]


def test_node_overrides_install_disk_and_labels(bundle):
    s = spec(workers=(PoolSpec("general", 1, install_disk="/dev/vda", node_labels={"tier": "pool"}),))
    cfg = doc(mc.render(s, bundle, pool="general", node=NodeSpec("w1", "/dev/nvme0n1", {"tier": "node"})))
    assert cfg["machine"]["install"]["disk"] == "/dev/nvme0n1"
    assert cfg["machine"]["nodeLabels"] == {"tier": "node"}


def test_merge_follows_talos_semantics():
    base = {"cluster": {"network": {"podSubnets": ["10.244.0.0/16"]}}, "machine": {"certSANs": ["a"], "x": 1, "y": 2}}
    patch = {
        "cluster": {"network": {"podSubnets": ["10.10.0.0/16"]}},
        "machine": {"certSANs": ["b"], "x": None, "y": {"$patch": "delete"}, "z": {"k": "v"}},
    }
    out = configpatch.merge(base, patch)
    assert out["cluster"]["network"]["podSubnets"] == ["10.10.0.0/16"]  # replaced, as Talos does
    assert out["machine"] == {"certSANs": ["a", "b"], "x": 1, "z": {"k": "v"}}
    assert base["machine"]["certSANs"] == ["a"]  # input untouched


def test_json_patch_operations():
    doc0 = {"a": {"b": [1, 2]}, "c": "x", "s~/": 1}
    ops = [
        {"op": "test", "path": "/c", "value": "x"},
        {"op": "add", "path": "/a/b/0", "value": 0},
        {"op": "replace", "path": "/c", "value": "y"},
        {"op": "copy", "from": "/a/b", "path": "/d"},
        {"op": "move", "from": "/c", "path": "/e"},
        {"op": "remove", "path": "/a/b/1"},
        {"op": "remove", "path": "/s~0~1"},
    ]
    assert configpatch.json_patch(doc0, ops, "p") == {"a": {"b": [0, 2]}, "d": [0, 1, 2], "e": "y"}
    assert doc0 == {"a": {"b": [1, 2]}, "c": "x", "s~/": 1}


@pytest.mark.parametrize(
    "ops, path, fragment",
    [
        ([{"op": "remove", "path": "/machine/nope"}], "patches[0][0]", "remove failed"),
        ([{"op": "add", "path": "/machine/certSANs/9", "value": 1}], "patches[0][0]", "out of range"),
        ([{"op": "test", "path": "/debug", "value": True}], "patches[0][0]", "test failed"),
        ([{"op": "frob", "path": "/x"}], "patches[0][0].op", "must be one of"),
        ([{"op": "add", "path": "machine"}], "patches[0][0].value", "is required"),
        ([{"op": "add", "path": "machine", "value": 1}], "patches[0][0].path", "JSON pointer"),
        ("- [unbalanced", "patches[0]", "not valid YAML"),
        (42, "patches[0]", "must be a list"),
    ],
)
def test_patch_errors_name_the_patch(bundle, ops, path, fragment):
    with pytest.raises(ConfigError) as err:
        mc.render(spec(patches=(ops,)), bundle)
    errors = getattr(err.value, "errors", [err.value])
    assert any(e.path == path and fragment in e.problem for e in errors), str(err.value)


def test_patch_that_gives_a_worker_a_ca_key_is_refused(bundle):
    key = base64.b64encode(bundle.k8s.key).decode()
    s = spec(workers=(PoolSpec("general", 1, patches=({"cluster": {"ca": {"key": key}}},)),))
    with pytest.raises(ConfigErrors) as err:
        mc.render(s, bundle, pool="general")
    assert err.value.path == "workers[0]"
    assert "cluster.ca.key: cluster CA key is not allowed on non-controlplane nodes" in str(err.value)
    assert key not in str(err.value)


# --- spec validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        ({"control_plane": PoolSpec(CONTROLPLANE, 2)}, "controlPlane.replicas: must be 1, 3 or 5, got 2"),
        ({"network": NetworkSpec(pod_subnets=("10.244.0.0",))}, "network.podSubnets[0]: not a CIDR"),
        ({"network": NetworkSpec(service_subnets=("10.96.0.0/12", "nope"))}, "network.serviceSubnets[1]: not a CIDR"),
        ({"network": NetworkSpec(service_subnets=("10.244.1.0/24",))}, "network.serviceSubnets[0]: overlaps network.podSubnets[0]"),
        ({"network": NetworkSpec(dns_domain="bad domain")}, "network.dnsDomain: must be a DNS name, got 'bad domain'"),
        ({"endpoint": "http://127.0.0.10:6443"}, "endpoint: must be https://host:port, got 'http://127.0.0.10:6443'"),
        ({"endpoint": "https://127.0.0.10"}, "endpoint: must be https://host:port, got 'https://127.0.0.10'"),
        ({"endpoint": "https://127.0.0.10:6443/api"}, "endpoint: must be https://host:port"),
        ({"name": "Lab_EU"}, "name: must be a DNS label"),
        ({"kubernetes_version": "latest"}, "kubernetesVersion: must be a version like 1.34.1, got 'latest'"),
        ({"installer_image": "ghcr.io/siderolabs/installer"}, "installerImage: must be an image reference with a tag or digest"),
        ({"cert_sans": ("ok.test", "not a san")}, "certSANs[1]: must be a DNS name or IP address"),
        ({"workers": (PoolSpec("general", -1),)}, "workers[0].replicas: must be a whole number >= 0, got -1"),
        ({"workers": (PoolSpec("a", 1), PoolSpec("a", 1))}, "workers[1].name: duplicate worker pool name 'a'"),
        ({"workers": (PoolSpec(CONTROLPLANE, 1),)}, "workers[0].name: must be a DNS label other than 'controlplane'"),
        ({"control_plane": PoolSpec(CONTROLPLANE, 1, install_disk="sda")}, "controlPlane.installDisk: must be a device path like /dev/sda, got 'sda'"),
        ({"control_plane": PoolSpec(CONTROLPLANE, 1, node_labels={"bad key!": "x"})}, "controlPlane.nodeLabels.bad key!: label key 'bad key!'"),
    ],
)
def test_bad_spec_errors_carry_exact_paths(bundle, change, message):
    with pytest.raises(ConfigErrors) as err:
        mc.render(spec(**change), bundle)
    assert any(str(e).startswith(message) for e in err.value.errors), str(err.value)


def test_all_spec_problems_are_reported_at_once_with_prefix():
    s = spec(control_plane=PoolSpec(CONTROLPLANE, 2), endpoint="ftp://x")
    problems = spec_problems(s, prefix="zones[1].")
    assert [p.path for p in problems] == ["zones[1].endpoint", "zones[1].controlPlane.replicas"]
    with pytest.raises(ConfigErrors) as err:
        validate_spec(s, prefix="zones[1].")
    assert str(err.value).splitlines()[1] == "zones[1].controlPlane.replicas: must be 1, 3 or 5, got 2"
    assert isinstance(err.value, ValueError)


def test_bad_node_spec(bundle):
    with pytest.raises(ConfigErrors) as err:
        mc.render(spec(), bundle, node=NodeSpec("n1", install_disk="disk0"))
    assert err.value.errors[0].path == "nodes.n1.installDisk"


# --- redaction ------------------------------------------------------------------------------


def _secret_fragments(bundle: secrets.SecretsBundle) -> list[str]:
    out = list(secrets.secret_values(bundle))
    for pem in (bundle.os.key, bundle.k8s.key, bundle.k8s_aggregator.key, bundle.etcd.key, bundle.k8s_serviceaccount_key):
        out += [line for line in pem.decode().splitlines() if line and not line.startswith("-----")]
    return out


@pytest.mark.parametrize("pool", [CONTROLPLANE, "general"])
def test_redaction_removes_every_secret_and_keeps_the_rest(bundle, pool):
    raw = mc.render(spec(), bundle, pool=pool)
    redacted = redact(raw)
    for value in _secret_fragments(bundle):
        assert value not in redacted
    before, after = doc(raw), yaml.safe_load(redacted)
    assert after["machine"]["ca"]["crt"] == before["machine"]["ca"]["crt"]
    assert after["cluster"]["controlPlane"] == before["cluster"]["controlPlane"]
    assert after["cluster"]["id"] == before["cluster"]["id"]
    assert after["machine"]["token"] == REDACTED and after["cluster"]["secret"] == REDACTED

    def strip(node, masked):
        if isinstance(node, dict):
            return {k: strip(v, masked.get(k) if isinstance(masked, dict) else None) for k, v in node.items()}
        if isinstance(node, list):
            return [strip(v, m) for v, m in zip(node, masked)]
        return REDACTED if masked == REDACTED else node

    assert strip(before, after) == after  # only masked fields changed


def test_redaction_covers_secrets_added_by_patches(bundle):
    patch = {"machine": {"network": {"interfaces": [{"interface": "wg0", "wireguard": {"privateKey": "S3CR3T=", "peers": [{"publicKey": "PUB="}]}}]}}}
    redacted = redact(mc.render(spec(patches=(patch,)), bundle))
    assert "S3CR3T=" not in redacted and "PUB=" in redacted


# --- precheck -------------------------------------------------------------------------------


def _mutated(raw: bytes, mutate) -> bytes:
    d = doc(raw)
    mutate(d)
    return yaml.safe_dump(d).encode()


def test_precheck_accepts_what_we_render(bundle):
    assert precheck(mc.render(spec(), bundle)) == []
    assert precheck(mc.render(spec(), bundle, pool="general")) == []


@pytest.mark.parametrize(
    "pool, mutate, expected",
    [
        (
            "general",
            lambda d: d["cluster"]["ca"].update(key="eA=="),
            [
                "cluster.ca.key: cluster CA key is not allowed on non-controlplane nodes (.cluster.ca)",
                "cluster.ca.key: issuing Kubernetes API CA key is not allowed on non-controlplane nodes (.cluster.ca)",
            ],
        ),
        (
            "general",
            lambda d: d["machine"]["ca"].update(key="eA=="),
            ["machine.ca.key: issuing Talos API CA key is not allowed on non-controlplane nodes (.machine.ca)"],
        ),
        (
            CONTROLPLANE,
            lambda d: d["cluster"]["network"]["cni"].update(name="calico"),
            ['cluster.network.cni.name: cni name should be one of ["flannel", "custom", "none"]'],
        ),
        (
            CONTROLPLANE,
            lambda d: d["cluster"]["controlPlane"].pop("endpoint"),
            ["cluster.controlPlane.endpoint: cluster controlplane endpoint is required"],
        ),
        (
            CONTROLPLANE,
            lambda d: d["machine"]["install"].pop("disk"),
            ["machine.install.disk: either install disk or diskSelector should be defined"],
        ),
        (
            CONTROLPLANE,
            lambda d: d["machine"].pop("install"),
            ['machine.install: install instructions are required in "metal" mode'],
        ),
        (
            "general",
            lambda d: d["cluster"].update(etcd={"ca": {"crt": "eA=="}}),
            ["cluster.etcd: etcd config is only allowed on control plane machines"],
        ),
        (
            CONTROLPLANE,
            lambda d: d["machine"]["ca"].pop("key"),
            ["machine.ca.key: issuing CA key is required for controlplane nodes (.machine.ca.key)"],
        ),
        (CONTROLPLANE, lambda d: d.update(persist=False), ["persist: .persist should be enabled"]),
        ("general", lambda d: d["machine"].update(type="boss"), ['machine.type: unknown machine type "boss"']),
    ],
)
def test_precheck_mirrors_machinery(bundle, pool, mutate, expected):
    assert precheck(_mutated(mc.render(spec(), bundle, pool=pool), mutate)) == expected


def test_unknown_cni_on_a_worker_is_not_checked_like_machinery(bundle):
    raw = _mutated(mc.render(spec(), bundle, pool="general"), lambda d: d["cluster"]["network"]["cni"].update(name="x"))
    assert precheck(raw) == []


def test_redact_never_echoes_unparsable_input():
    with pytest.raises(ValueError) as err:
        redact("machine:\n  token: sup3rs3cret\n  - broken")
    assert "sup3rs3cret" not in str(err.value)


def test_strings_go_would_misread_are_quoted(bundle):
    s = spec(control_plane=PoolSpec(CONTROLPLANE, 3, node_labels={"tier": "1e3", "num": "0o17"}))
    text = mc.render(s, bundle).decode()
    assert '        tier: "1e3"\n' in text and '        num: "0o17"\n' in text
    assert "&id" not in text and "*id" not in text
