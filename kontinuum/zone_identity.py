"""Zone identity: a long-lived ed25519 key pair, issued once and never rotated (seeds, "Add zone").

The private half goes only to the zone's own cluster (a kubernetes.io/tls Secret the zone's
kontinuum-server signs its hub calls with); the hub keeps only the public half, wrapped in a
self-signed certificate whose SHA-256 thumbprint is the zone's visible fingerprint. Pure: no
I/O, no Pulumi.

The key is written as standard PKCS#8 (`PRIVATE KEY`), the form Go's crypto/tls and Python's
ssl load without help; `pki.load_private_key` reads it as well as Talos's own label.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID

from kontinuum.hub.crds import zone_object_name
from kontinuum.talos import pki

VALIDITY_DAYS = 36525  # 100 years: the identity is never rotated, so it must never expire either
ORGANIZATION = "kontinuum zone identity"


@dataclass(frozen=True)
class ZoneIdentity:
    """PEM private key (PKCS#8), PEM self-signed certificate of its public half, and the thumbprint."""

    private_key_pem: str
    certificate_pem: str
    thumbprint: str

    def __repr__(self) -> str:  # never let the key reach a log line through repr()
        return f"ZoneIdentity(thumbprint={self.thumbprint}, private_key_pem=<redacted>)"


def common_name(region: str, zone: str) -> str:
    """The certificate's CN: the zone object name `<region>-<zone>`."""
    if not region or not zone:
        raise ValueError(f"region and zone are both required, got region={region!r} zone={zone!r}")
    return zone_object_name(region, zone)


def issue(region: str, zone: str, *, now: dt.datetime | None = None, days: int = VALIDITY_DAYS) -> ZoneIdentity:
    """A fresh ed25519 key and its self-signed certificate (CN `<region>-<zone>`)."""
    cn = common_name(region, zone)
    start = (now or pki.utcnow()).astimezone(dt.timezone.utc).replace(microsecond=0)
    key = ed25519.Ed25519PrivateKey.generate()
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
        x509.NameAttribute(NameOID.COMMON_NAME, cn),
    ])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number((int.from_bytes(hashlib.sha256(public_bytes(public)).digest()[:16], "big") >> 1) or 1)
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                          encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, None)  # Ed25519 signs the message itself: no separate hash
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    return ZoneIdentity(key_pem, cert_pem, thumbprint(cert_pem))


def public_bytes(public_key) -> bytes:
    """DER SubjectPublicKeyInfo: what a key and a certificate are compared by."""
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def thumbprint(certificate_pem: str | bytes) -> str:
    """SHA-256 over the certificate's DER encoding, lowercase hex (what `openssl x509 -fingerprint -sha256` shows)."""
    der = pki.load_certificate(certificate_pem).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def key_matches_certificate(private_key_pem: str | bytes, certificate_pem: str | bytes) -> bool:
    """True if the key's public half is the certificate's public key. Raises ValueError on unreadable PEM."""
    key = pki.load_private_key(private_key_pem)
    cert = pki.load_certificate(certificate_pem)
    return public_bytes(key.public_key()) == public_bytes(cert.public_key())


def check(identity: ZoneIdentity, region: str, zone: str) -> list[str]:
    """Every reason this identity is not a valid one for `<region>-<zone>`; empty when it is."""
    problems = []
    try:
        cert = pki.load_certificate(identity.certificate_pem)
    except ValueError as e:
        return [f"certificate is not readable PEM ({e})"]
    try:
        if not key_matches_certificate(identity.private_key_pem, identity.certificate_pem):
            problems.append("private key does not match the certificate")
    except (ValueError, TypeError) as e:
        problems.append(f"private key is not readable PEM ({e})")
    if not isinstance(cert.public_key(), ed25519.Ed25519PublicKey):
        problems.append(f"certificate key is {type(cert.public_key()).__name__}, want Ed25519")
    cns = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if cns != [common_name(region, zone)]:
        problems.append(f"certificate CN is {cns}, want {common_name(region, zone)!r}")
    if thumbprint(identity.certificate_pem) != identity.thumbprint:
        problems.append("thumbprint does not match the certificate")
    return problems
