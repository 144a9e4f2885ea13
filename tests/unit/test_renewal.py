"""Client-certificate renewal (issue 18): the admin talosconfig and kubeconfig that the stack
holds are renewed by a plain `pulumi up` within renewBeforeDays of expiry, locally from the
bundle's CAs, and their expiry is an output. The clock and the validity are injected."""

from __future__ import annotations

import datetime as dt

import pytest

from kontinuum.talos import pki, renewal, secrets, talosconfig
from providers.kubeconfig import KubeconfigProvider
from providers.talos_secrets import TalosSecretsProvider

BUNDLE = secrets.generate()


def now() -> dt.datetime:
    """The clock at assertion time (a module-level constant goes stale when xdist runs the module late)."""
    return dt.datetime.now(dt.timezone.utc)


def issuer(cert_pem: bytes) -> str:
    return pki.load_certificate(cert_pem).issuer.rfc4514_string()


@pytest.fixture
def short_lived(monkeypatch):
    """Client certificates issued for 20 days (as if issued 345 days ago)."""
    monkeypatch.setattr(talosconfig, "CLIENT_CERT_DAYS", 20)


def test_talosconfig_is_renewed_within_renew_before_and_only_then(short_lived, monkeypatch):
    p = TalosSecretsProvider()
    props = {"clusterName": "eu-a", "endpoints": ["10.0.0.1"], "renewBeforeDays": 30,
             "importYaml": secrets.dump(BUNDLE)}
    old = p.create(props).outs
    expires = dt.datetime.fromisoformat(old["talosconfigExpires"].replace("Z", "+00:00"))
    assert dt.timedelta(days=19) < expires - now() <= dt.timedelta(days=20, minutes=5)
    assert p.diff("eu-a", old, {**props}).changes  # due: a plain up renews it

    monkeypatch.setattr(talosconfig, "CLIENT_CERT_DAYS", 365)
    new = p.update("eu-a", old, {**props}).outs
    crt = talosconfig.parse(new["talosconfig"]).crt
    assert crt != talosconfig.parse(old["talosconfig"]).crt and issuer(crt) == issuer(BUNDLE.os.crt)
    assert new["secretsYaml"] == old["secretsYaml"]  # the bundle never changes
    assert new["talosconfigExpires"] > old["talosconfigExpires"]
    assert not p.diff("eu-a", new, {**props}).changes  # renewed: nothing due any more
    assert p.diff("eu-a", new, {**props, "renewBeforeDays": 400}).changes  # a wider window makes it due again
    kept = p.update("eu-a", new, {**props, "endpoints": ["10.0.0.2"]}).outs  # not due: the same certificate
    assert talosconfig.parse(kept["talosconfig"]).crt == crt


def kubeconfig_with(days: int) -> str:
    from lab.controlplane import kubeconfig_text

    admin = pki.issue_cert(BUNDLE.k8s, common_name="admin", organizations=["system:masters"], client=True,
                           key_type="ecdsa", days=days)
    return kubeconfig_text("eu-a", "https://10.0.0.1:6443", BUNDLE.k8s.crt, admin)


def test_kubeconfig_is_renewed_locally_without_asking_a_node():
    p = KubeconfigProvider()
    props = {"address": "10.0.0.1", "talosPort": 50000, "talosconfig": "tc", "timeout": 1, "requestTimeout": 1,
             "secretsYaml": secrets.dump(BUNDLE), "renewBeforeDays": 30}
    old = {**props, "kubeconfig": kubeconfig_with(10), "endpoint": "https://10.0.0.1:6443", "kubernetesVersion": "v1"}
    assert p.diff("10.0.0.1", old, props).changes
    new = p.update("10.0.0.1", old, props).outs  # 10.0.0.1 is never dialled: the update would time out
    crt = renewal.kubeconfig_cert(new["kubeconfig"])
    assert renewal.expiry(crt) - now() > dt.timedelta(days=364) and issuer(crt) == issuer(BUNDLE.k8s.crt)
    assert "https://10.0.0.1:6443" in new["kubeconfig"] and new["kubernetesVersion"] == "v1"
    assert new["kubeconfigExpires"] == renewal.rfc3339(renewal.expiry(crt))
    assert not p.diff("10.0.0.1", new, props).changes
    fresh = {**old, "kubeconfig": kubeconfig_with(365)}
    assert not p.diff("10.0.0.1", fresh, props).changes
    assert p.update("10.0.0.1", fresh, props).outs["kubeconfig"] == fresh["kubeconfig"]

