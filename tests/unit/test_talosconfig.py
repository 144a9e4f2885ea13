"""talosconfig client certificates and file format, as `talosctl gen config` writes them."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kontinuum.errors import ConfigError
from kontinuum.talos import pki, secrets, talosconfig

FIXTURE = Path(__file__).parent / "fixtures" / "talosctl-secrets.yaml"
NOW = dt.datetime(2026, 5, 6, 7, 8, 9, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def os_ca() -> pki.CertKey:
    return secrets.load(FIXTURE.read_text()).os


@pytest.mark.parametrize("role", ["os:admin", "os:reader"])
def test_client_cert_matches_talosctl(os_ca, role):
    client = talosconfig.issue_client_cert(os_ca, role, now=NOW)
    cert = x509.load_pem_x509_certificate(client.crt)
    ca = x509.load_pem_x509_certificate(os_ca.crt)

    assert [(a.oid, a.value) for a in cert.subject] == [(NameOID.ORGANIZATION_NAME, role)]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME) == []
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)

    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and not (ku.key_encipherment or ku.key_cert_sign or ku.content_commitment)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest

    assert cert.not_valid_before_utc == NOW
    assert cert.not_valid_after_utc == NOW + dt.timedelta(days=365)

    assert client.key.startswith(b"-----BEGIN ED25519 PRIVATE KEY-----\n")
    assert isinstance(pki.load_private_key(client.key), ed25519.Ed25519PrivateKey)


def test_unknown_role_is_refused(os_ca):
    with pytest.raises(ValueError, match="role must be one of"):
        talosconfig.issue_client_cert(os_ca, "admin")


def test_render_has_talosctl_layout_and_parses_back(os_ca):
    client = talosconfig.issue_client_cert(os_ca, now=NOW)
    text = talosconfig.render("lab-eu", ["127.0.0.11", "127.0.0.12"], ["127.0.0.11"], os_ca.crt, client)

    doc = yaml.safe_load(text)
    assert list(doc) == ["context", "contexts"]
    assert doc["context"] == "lab-eu"
    ctx = doc["contexts"]["lab-eu"]
    assert list(ctx) == ["endpoints", "nodes", "ca", "crt", "key"]
    assert base64.b64decode(ctx["ca"]) == os_ca.crt
    assert base64.b64decode(ctx["crt"]) == client.crt
    assert base64.b64decode(ctx["key"]) == client.key
    assert text.startswith("context: lab-eu\ncontexts:\n    lab-eu:\n        endpoints:\n            - 127.0.0.11\n")

    parsed = talosconfig.parse(text)
    assert parsed == talosconfig.TalosConfig(
        context="lab-eu",
        endpoints=["127.0.0.11", "127.0.0.12"],
        nodes=["127.0.0.11"],
        ca=os_ca.crt,
        crt=client.crt,
        key=client.key,
    )
    assert client.key.decode() not in repr(parsed)


def test_render_omits_empty_nodes_and_is_deterministic(os_ca):
    client = talosconfig.issue_client_cert(os_ca, now=NOW)
    a = talosconfig.render("c", ["127.0.0.11"], [], os_ca.crt, client)
    assert a == talosconfig.render("c", ["127.0.0.11"], [], os_ca.crt, client)
    assert "nodes" not in yaml.safe_load(a)["contexts"]["c"]


def test_parse_picks_named_context_and_folds_legacy_target():
    text = (
        "context: a\n"
        "contexts:\n"
        "    a:\n        endpoints: [127.0.0.1]\n"
        "    b:\n        target: 127.0.0.2\n        ca: " + base64.b64encode(b"CA").decode() + "\n"
    )
    assert talosconfig.parse(text).endpoints == ["127.0.0.1"]
    b = talosconfig.parse(text, context="b")
    assert b.endpoints == ["127.0.0.2"] and b.ca == b"CA" and b.crt == b""


@pytest.mark.parametrize(
    "text, context, path",
    [
        ("context: x\ncontexts: {}\n", None, "contexts"),
        ("contexts:\n    a: {endpoints: []}\n", None, "context"),
        ("context: a\ncontexts:\n    a: {endpoints: []}\n", "zzz", "context"),
        ("context: a\ncontexts:\n    a: {endpoints: [], crt: '!!'}\n", None, "contexts.a.crt"),
        ("context: a\ncontexts:\n    a: {endpoints: 5}\n", None, "contexts.a.endpoints"),
    ],
)
def test_parse_errors_name_the_field(text, context, path):
    with pytest.raises(ConfigError) as err:
        talosconfig.parse(text, context)
    assert err.value.path == path
