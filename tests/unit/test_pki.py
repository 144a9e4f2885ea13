"""PKI helpers shared with the Talos client and emulator: Talos key labels, leaf certs, ssl."""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kontinuum.talos import pki, secrets

FIXTURE = Path(__file__).parent / "fixtures" / "talosctl-secrets.yaml"


@pytest.fixture(scope="module")
def bundle() -> secrets.SecretsBundle:
    return secrets.load(FIXTURE.read_text())


def test_every_talos_key_label_loads(bundle):
    assert isinstance(pki.load_private_key(bundle.os.key), ed25519.Ed25519PrivateKey)
    assert isinstance(pki.load_private_key(bundle.k8s.key), ec.EllipticCurvePrivateKey)
    standard = pki.to_standard_pem(bundle.os.key)
    assert standard.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert isinstance(pki.load_private_key(standard), ed25519.Ed25519PrivateKey)
    assert pki.to_standard_pem(bundle.k8s.key).startswith(b"-----BEGIN PRIVATE KEY-----")


def test_server_leaf_has_sans_eku_and_loads_into_python_ssl(bundle, tmp_path):
    leaf = pki.issue_cert(
        bundle.os, dns_names=["node-1"], ip_addresses=["127.0.0.11"], server=True, key_type="ed25519"
    )
    cert = x509.load_pem_x509_certificate(leaf.crt)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["node-1"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.11")]
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    assert cert.subject != x509.load_pem_x509_certificate(bundle.os.crt).subject
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(bundle.os.crt))

    (tmp_path / "crt.pem").write_bytes(leaf.crt)
    (tmp_path / "key.pem").write_bytes(pki.to_standard_pem(leaf.key))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "crt.pem", tmp_path / "key.pem")


def test_ecdsa_leaf_from_kubernetes_ca(bundle):
    leaf = pki.issue_cert(bundle.k8s, common_name="admin", organizations=["system:masters"], client=True, key_type="ecdsa")
    cert = x509.load_pem_x509_certificate(leaf.crt)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "admin"
    assert leaf.key.startswith(b"-----BEGIN EC PRIVATE KEY-----")
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(bundle.k8s.crt))


def test_leaf_subject_must_differ_from_ca(bundle):
    with pytest.raises(ValueError, match="subject must differ"):
        pki.issue_cert(bundle.os, organizations=["talos"], client=True)


def test_leaf_needs_a_purpose(bundle):
    with pytest.raises(ValueError, match="server=True, client=True"):
        pki.issue_cert(bundle.os, organizations=["x"])


def test_certkey_repr_hides_the_key(bundle):
    assert bundle.os.key.decode() not in repr(bundle.os)
