"""Refresh reads (issue 20): what each provider makes of what it reads, without a network:
a drifted value makes the next diff plan the repair, a silent node keeps its record."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kontinuum.preview_summary import summarize
from providers import config_apply, kubeconfig
from providers.instance_pool import InstancePoolProvider
from providers.registry_join import RegistryJoinProvider


def a_kubeconfig(valid_for: dt.timedelta) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - dt.timedelta(days=400)).not_valid_after(now + valid_for)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "admin@z",
        "clusters": [{"name": "z", "cluster": {"server": "https://10.0.0.5:6443"}}],
        "contexts": [{"name": "admin@z", "context": {"cluster": "z", "user": "admin@z"}}],
        "users": [{"name": "admin@z", "user": {"client-certificate-data": base64.b64encode(pem).decode()}}]})


def test_a_kubeconfig_near_its_end_is_drift_and_the_next_up_renews_it():
    p = kubeconfig.KubeconfigProvider()
    fresh = p.read("10.0.0.5", {"address": "10.0.0.5", "kubeconfig": a_kubeconfig(dt.timedelta(days=300))})
    assert "valid" not in fresh.outs  # nothing wrong: the record is unchanged
    old = p.read("10.0.0.5", {"address": "10.0.0.5", "kubeconfig": a_kubeconfig(dt.timedelta(days=3))})
    assert old.outs["valid"] is False
    assert p.diff("10.0.0.5", old.outs, {"address": "10.0.0.5"}).changes is True
    assert p.read("10.0.0.5", {"address": "10.0.0.5", "kubeconfig": "not: a kubeconfig"}).outs.get("valid") is None


def test_lost_claims_and_a_stale_heartbeat_plan_the_repair():
    pool = {"pool": "p", "replicas": 2, "members": [{"name": "m1"}]}
    assert InstancePoolProvider().diff("p", pool, {"pool": "p", "replicas": 2}).changes is True
    assert InstancePoolProvider().diff("p", {**pool, "replicas": 1}, {"pool": "p", "replicas": 1}).changes is False
    assert RegistryJoinProvider().diff("j", {"joined": False}, {}).changes is True
    assert RegistryJoinProvider().diff("j", {"joined": True}, {}).changes is False


@pytest.mark.parametrize("seen, drift", [("configured", None), ("unreachable", None),
                                         ("maintenance", "maintenance mode"), ("foreign", "another cluster")])
def test_config_apply_read(monkeypatch, seen, drift):
    monkeypatch.setattr(config_apply, "observe", lambda props: seen)
    props = {"address": "10.0.0.5", "configHash": "ab" * 32}
    outs = config_apply.read_config_apply(props)
    if drift is None:
        assert outs == props  # a node that answers as configured, or not at all, keeps its record
    else:
        assert outs["configHash"].startswith(config_apply.DRIFT) and drift in outs["configHash"]
        news = {"instance": None, "address": "10.0.0.5", "config": "version: v1alpha1\n"}
        assert config_apply.diff_config_apply(outs, news).changes is True
        plan = {"changeSummary": {"update": 1}, "steps": [{
            "op": "update", "urn": "urn:pulumi:eu::kontinuum::x$pulumi-python:dynamic/talos:ConfigApply::eu-a-0a1b2c3d",
            "oldState": {"inputs": {}, "outputs": {**outs, "pool": "web"}}, "newState": {"inputs": {}}}]}
        (node,) = summarize("eu", plan, region="eu", zones=["a"]).configs_changed
        assert node.node == "10.0.0.5" and drift in node.why
