"""Zone identity: pure crypto (issue, thumbprint, match) and the ZoneIdentity provider's pure parts."""

from __future__ import annotations

import datetime as dt
import hashlib
import subprocess

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from kontinuum import zone_identity
from kontinuum.talos import pki
from lab.standins.kontinuum_server import identity_problem, key_matches_certificate as standin_matches
from providers.zone_identity import SECRET_OUTPUTS, ZoneIdentityProvider


@pytest.fixture(scope="module")
def ident() -> zone_identity.ZoneIdentity:
    return zone_identity.issue("eu", "eu-1a")


def test_issue_is_ed25519_self_signed_with_zone_cn_and_long_validity(ident):
    cert = x509.load_pem_x509_certificate(ident.certificate_pem.encode())
    assert isinstance(cert.public_key(), ed25519.Ed25519PublicKey)
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["eu-eu-1a"]
    assert cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)  # self-signed by its own key
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert life >= dt.timedelta(days=365 * 99)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert zone_identity.check(ident, "eu", "eu-1a") == []


def test_private_key_is_standard_pkcs8_and_never_in_repr(ident):
    assert ident.private_key_pem.startswith("-----BEGIN PRIVATE KEY-----")
    key = serialization.load_pem_private_key(ident.private_key_pem.encode(), password=None)
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    assert "PRIVATE KEY" not in repr(ident) and ident.thumbprint in repr(ident)


def test_thumbprint_is_sha256_of_der_and_stable(ident):
    der = x509.load_pem_x509_certificate(ident.certificate_pem.encode()).public_bytes(serialization.Encoding.DER)
    assert ident.thumbprint == hashlib.sha256(der).hexdigest()
    assert len(ident.thumbprint) == 64 and ident.thumbprint == ident.thumbprint.lower()
    # stable: recomputed from str or bytes, with or without surrounding whitespace
    assert zone_identity.thumbprint(ident.certificate_pem) == ident.thumbprint
    assert zone_identity.thumbprint(ident.certificate_pem.encode()) == ident.thumbprint
    assert zone_identity.thumbprint("\n" + ident.certificate_pem + "\n") == ident.thumbprint


def test_thumbprint_matches_openssl_when_available(ident, tmp_path):
    try:
        out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256"], input=ident.certificate_pem,
                             capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        pytest.skip("no openssl binary")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().split("=", 1)[1].replace(":", "").lower() == ident.thumbprint


def test_each_issue_is_a_new_key(ident):
    other = zone_identity.issue("eu", "eu-1a")
    assert other.thumbprint != ident.thumbprint
    assert other.private_key_pem != ident.private_key_pem


def test_key_matches_own_certificate_only(ident):
    other = zone_identity.issue("eu", "eu-1b")
    assert zone_identity.key_matches_certificate(ident.private_key_pem, ident.certificate_pem)
    assert not zone_identity.key_matches_certificate(ident.private_key_pem, other.certificate_pem)
    assert not zone_identity.key_matches_certificate(other.private_key_pem, ident.certificate_pem)
    # a Talos-labelled copy of the same key still matches
    talos_label = pki.talos_key_pem(pki.load_private_key(ident.private_key_pem))
    assert b"ED25519 PRIVATE KEY" in talos_label
    assert zone_identity.key_matches_certificate(talos_label, ident.certificate_pem)


def test_key_mismatch_and_bad_pem(ident):
    other = zone_identity.issue("eu", "eu-1a")
    mixed = zone_identity.ZoneIdentity(other.private_key_pem, ident.certificate_pem, ident.thumbprint)
    assert zone_identity.check(mixed, "eu", "eu-1a") == ["private key does not match the certificate"]
    assert "CN" in zone_identity.check(ident, "eu", "eu-1b")[0]
    wrong_tp = zone_identity.ZoneIdentity(ident.private_key_pem, ident.certificate_pem, "00" * 32)
    assert zone_identity.check(wrong_tp, "eu", "eu-1a") == ["thumbprint does not match the certificate"]
    with pytest.raises(ValueError):
        zone_identity.key_matches_certificate("not a key", ident.certificate_pem)
    with pytest.raises(ValueError):
        zone_identity.thumbprint("not a certificate")


def test_the_lab_server_stand_in_accepts_exactly_the_matching_key(ident):
    """What the footprint delivers (tls.key) and the hub holds (tls.crt) is what the stand-in checks."""
    other = zone_identity.issue("eu", "eu-1a")
    assert standin_matches(ident.private_key_pem.encode(), ident.certificate_pem.encode())
    assert identity_problem(ident.private_key_pem.encode(), ident.certificate_pem.encode(), key_at="k", cert_at="c") is None
    assert "does not match" in identity_problem(other.private_key_pem.encode(), ident.certificate_pem.encode(),
                                                key_at="k", cert_at="c")


def test_region_and_zone_required():
    with pytest.raises(ValueError):
        zone_identity.issue("", "eu-1a")
    with pytest.raises(ValueError):
        zone_identity.common_name("eu", "")


# -- provider: pure check/diff, create issues once -------------------------------------------


def test_provider_check_requires_region_and_zone():
    p = ZoneIdentityProvider()
    assert p.check({}, {"region": "eu", "zone": "eu-1a"}).failures == []
    assert sorted(f.property for f in p.check({}, {"region": "", "zone": None}).failures) == ["region", "zone"]


def test_provider_diff_never_changes_or_replaces():
    p = ZoneIdentityProvider()
    olds = {"region": "eu", "zone": "eu-1a", "privateKeyPem": "k", "certificatePem": "c", "thumbprint": "t"}
    for news in ({"region": "eu", "zone": "eu-1a"}, {"region": "us", "zone": "us-1a"}, {}):
        d = p.diff("eu-eu-1a", olds, news)
        assert d.changes is False and not d.replaces


def test_provider_create_outputs_a_valid_identity():
    out = ZoneIdentityProvider().create({"region": "eu", "zone": "eu-1a"})
    assert out.id == "eu-eu-1a"
    o = out.outs
    ident = zone_identity.ZoneIdentity(o["privateKeyPem"], o["certificatePem"], o["thumbprint"])
    assert zone_identity.check(ident, "eu", "eu-1a") == []
    assert o["commonName"] == "eu-eu-1a"
    assert SECRET_OUTPUTS == ("privateKeyPem",)
