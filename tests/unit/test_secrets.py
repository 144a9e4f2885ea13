"""Secrets bundle: what `talosctl gen secrets` would produce, in its exact file format."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import re
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kontinuum.errors import ConfigError
from kontinuum.talos import pki, secrets

FIXTURE = Path(__file__).parent / "fixtures" / "talosctl-secrets.yaml"
NOW = dt.datetime(2026, 3, 4, 5, 6, 7, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def bundle() -> secrets.SecretsBundle:
    return secrets.generate(now=NOW)


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _label(pem: bytes) -> str:
    return pem.decode().splitlines()[0]


def test_tokens_and_random_secrets_have_talosctl_shapes(bundle):
    token = re.compile(r"^[a-z0-9]{6}\.[a-z0-9]{16}$")
    assert token.match(bundle.bootstrap_token)
    assert token.match(bundle.trustd_token)
    for value in (bundle.cluster_id, bundle.cluster_secret, bundle.secretbox_secret):
        assert len(base64.b64decode(value, validate=True)) == 32
    assert bundle.aescbc_secret == ""


@pytest.mark.parametrize(
    "name, key_type, label, subject",
    [
        ("os", ed25519.Ed25519PrivateKey, "-----BEGIN ED25519 PRIVATE KEY-----", [(NameOID.ORGANIZATION_NAME, "talos")]),
        ("k8s", ec.EllipticCurvePrivateKey, "-----BEGIN EC PRIVATE KEY-----", [(NameOID.ORGANIZATION_NAME, "kubernetes")]),
        ("k8s_aggregator", ec.EllipticCurvePrivateKey, "-----BEGIN EC PRIVATE KEY-----", [(NameOID.COMMON_NAME, "front-proxy")]),
        ("etcd", ec.EllipticCurvePrivateKey, "-----BEGIN EC PRIVATE KEY-----", [(NameOID.ORGANIZATION_NAME, "etcd")]),
    ],
)
def test_cas_match_talosctl(bundle, name, key_type, label, subject):
    ca: pki.CertKey = getattr(bundle, name)
    cert = _cert(ca.crt)
    key = pki.load_private_key(ca.key)
    assert isinstance(key, key_type)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        assert key.curve.name == "secp256r1"
    assert _label(ca.key) == label
    assert [(a.oid, a.value) for a in cert.subject] == subject
    assert cert.issuer == cert.subject
    assert cert.not_valid_before_utc == NOW
    assert cert.not_valid_after_utc == NOW + dt.timedelta(hours=87600)
    assert 0 < cert.serial_number < 2**128

    ku = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.key_cert_sign and ku.value.digital_signature
    assert not ku.value.key_encipherment
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    cert.verify_directly_issued_by(cert)


def test_os_ca_key_body_is_pkcs8(bundle):
    # Talos relabels a PKCS#8 body; the standard form must be the same DER.
    body = bundle.os.key.replace(b"ED25519 PRIVATE KEY", b"PRIVATE KEY")
    assert pki.to_standard_pem(bundle.os.key) == body


def test_service_account_key_is_rsa_4096_pkcs1(bundle):
    key = pki.load_private_key(bundle.k8s_serviceaccount_key)
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 4096
    assert _label(bundle.k8s_serviceaccount_key) == "-----BEGIN RSA PRIVATE KEY-----"


def test_dump_then_load_gives_the_same_bundle(bundle):
    assert secrets.load(secrets.dump(bundle)) == bundle


def test_fixture_load_dump_is_byte_for_byte():
    text = FIXTURE.read_text()
    assert secrets.dump(secrets.load(text)) == text


def test_dump_layout_is_talosctls(bundle):
    lines = secrets.dump(bundle).splitlines()
    keys = [re.match(r"^(\s*)([a-z0-9]+):", line).group(0).strip() for line in lines]
    assert keys == [
        "cluster:", "id:", "secret:",
        "secrets:", "bootstraptoken:", "secretboxencryptionsecret:",
        "trustdinfo:", "token:",
        "certs:",
        "etcd:", "crt:", "key:",
        "k8s:", "crt:", "key:",
        "k8saggregator:", "crt:", "key:",
        "k8sserviceaccount:", "key:",
        "os:", "crt:", "key:",
    ]  # fmt: skip
    assert lines[1].startswith("    id: ") and lines[10].startswith("        crt: ")
    crt = lines[10].split(": ", 1)[1]
    assert base64.b64decode(crt) == bundle.etcd.crt  # base64 of the whole PEM text


def test_numeric_looking_token_is_quoted_like_go(bundle):
    odd = dataclasses.replace(bundle, bootstrap_token="123456.1234567890123456")
    text = secrets.dump(odd)
    assert '    bootstraptoken: "123456.1234567890123456"\n' in text
    assert secrets.load(text) == odd
    assert secrets.dump(secrets.load(text)) == text


def test_legacy_aescbc_bundle_round_trips():
    text = FIXTURE.read_text().replace("secretboxencryptionsecret:", "aescbcencryptionsecret:")
    legacy = secrets.load(text)
    assert legacy.secretbox_secret == "" and legacy.aescbc_secret
    assert secrets.dump(legacy) == text


def _drop(text: str, start: str, count: int) -> str:
    lines = text.splitlines(keepends=True)
    i = next(n for n, line in enumerate(lines) if line.startswith(start))
    return "".join(lines[:i] + lines[i + count :])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: _drop(t, "    os:", 3), "certs.os is required"),
        (lambda t: _drop(t, "    k8saggregator:", 3), "certs.k8saggregator is required"),
        (lambda t: _drop(t, "    k8sserviceaccount:", 2), "certs.k8sserviceaccount is required"),
        (lambda t: _drop(t, "    id:", 1), "cluster.id is required"),
        (lambda t: _drop(t, "trustdinfo:", 2), "trustdinfo is required"),
        (lambda t: _drop(t, "    bootstraptoken:", 1), "secrets.bootstraptoken is required"),
        (
            lambda t: _drop(t, "    secretboxencryptionsecret:", 1),
            "one of [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret] is required",
        ),
        (
            lambda t: t.replace("trustdinfo:", "    aescbcencryptionsecret: eA==\ntrustdinfo:"),
            "only one of [secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret] is allowed",
        ),
        (lambda t: re.sub(r"(    etcd:\n        crt: )\S+", r"\1not*base64", t), "certs.etcd.crt is not valid base64"),
        (lambda t: re.sub(r"(    k8s:\n        crt: )\S+", r"\1aGVsbG8=", t), "certs.k8s.crt is not a PEM certificate"),
        (lambda t: "- a list\n", "secrets bundle must be a YAML mapping"),
    ],
)
def test_load_names_the_bad_field(mutate, message):
    with pytest.raises(ConfigError) as err:
        secrets.load(mutate(FIXTURE.read_text()))
    assert str(err.value).endswith(message)


def test_load_rejects_a_key_that_does_not_match_its_certificate():
    text = FIXTURE.read_text()
    os_key = re.search(r"    os:\n        crt: \S+\n        key: (\S+)", text).group(1)
    etcd_key = re.search(r"    etcd:\n        crt: \S+\n        key: (\S+)", text).group(1)
    swapped = text.replace(etcd_key, os_key)
    with pytest.raises(ConfigError, match="certs.etcd key does not match its certificate"):
        secrets.load(swapped)


def test_repr_never_shows_secret_material(bundle):
    shown = repr(bundle) + repr(bundle.os)
    for value in secrets.secret_values(bundle):
        assert value not in shown
    assert bundle.os.key.decode() not in shown
