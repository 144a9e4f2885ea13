"""Small PKI toolkit shared by the secrets bundle, talosconfig and the Talos client/emulator.

Talos writes keys under its own PEM labels (`ED25519 PRIVATE KEY` with a PKCS#8 body,
`EC PRIVATE KEY` SEC1, `RSA PRIVATE KEY` PKCS#1); everything here reads all of them and
writes the native one, so files stay interchangeable with talosctl.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from typing import Iterable, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KeyType = Literal["ed25519", "ecdsa", "rsa"]
PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

ED25519_LABEL = b"ED25519 PRIVATE KEY"
_PKCS8_LABEL = b"PRIVATE KEY"


@dataclass(frozen=True)
class CertKey:
    """A PEM certificate with its PEM private key (Talos's native key label)."""

    crt: bytes
    key: bytes

    def __repr__(self) -> str:  # never let a key reach a log line through repr()
        return f"CertKey(crt=<{len(self.crt)} bytes>, key=<redacted>)"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _aware(now: dt.datetime | None) -> dt.datetime:
    """Certificates carry second precision in UTC; normalise so equal inputs give equal certs."""
    now = now or utcnow()
    if now.tzinfo is None:
        now = now.replace(tzinfo=dt.timezone.utc)
    return now.astimezone(dt.timezone.utc).replace(microsecond=0)


def _relabel(pem: bytes, old: bytes, new: bytes) -> bytes:
    return pem.replace(b"-----BEGIN " + old + b"-----", b"-----BEGIN " + new + b"-----").replace(
        b"-----END " + old + b"-----", b"-----END " + new + b"-----"
    )


def load_private_key(pem: bytes | str, *, check_rsa: bool = True) -> PrivateKey:
    """Load a key under any label Talos uses, including the non-standard Ed25519 one.

    check_rsa=False skips OpenSSL's RSA consistency proof (~0.3 s for a 4096-bit key), for keys
    read back from our own encrypted state on every program run."""
    data = pem.encode() if isinstance(pem, str) else pem
    if ED25519_LABEL in data:
        data = _relabel(data, ED25519_LABEL, _PKCS8_LABEL)
    key = serialization.load_pem_private_key(data, password=None, unsafe_skip_rsa_key_validation=not check_rsa)
    if not isinstance(key, (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise ValueError(f"unsupported private key type {type(key).__name__}")
    return key


def load_certificate(pem: bytes | str) -> x509.Certificate:
    data = pem.encode() if isinstance(pem, str) else pem
    return x509.load_pem_x509_certificate(data)


def talos_key_pem(key: PrivateKey) -> bytes:
    """Serialise a key the way Talos does, so talosctl and machinery accept our files as their own."""
    if isinstance(key, ed25519.Ed25519PrivateKey):
        pkcs8 = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return _relabel(pkcs8, _PKCS8_LABEL, ED25519_LABEL)
    # TraditionalOpenSSL is SEC1 (`EC PRIVATE KEY`) for EC and PKCS#1 (`RSA PRIVATE KEY`) for RSA.
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )


def to_standard_pem(key_pem: bytes | str) -> bytes:
    """Re-encode any Talos key as PKCS#8 `PRIVATE KEY`, the form Python's ssl always loads."""
    return load_private_key(key_pem).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_key(key_type: KeyType) -> PrivateKey:
    if key_type == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    if key_type == "ecdsa":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=4096)
    raise ValueError(f"key_type must be ed25519, ecdsa or rsa, got {key_type!r}")


def _sign_hash(key: PrivateKey) -> hashes.HashAlgorithm | None:
    # Ed25519 signs the message itself; ECDSA/RSA match Go's defaults (SHA-256).
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _name(common_name: str | None, organizations: Iterable[str]) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    if common_name:
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _serial() -> int:
    # 128 random bits like siderolabs/crypto; forced positive and non-zero.
    return (int.from_bytes(os.urandom(16), "big") >> 1) or 1


def new_ca(
    *,
    common_name: str | None = None,
    organizations: Iterable[str] = (),
    key_type: KeyType = "ecdsa",
    days: int = 3650,
    now: dt.datetime | None = None,
) -> CertKey:
    """Self-signed CA with the extensions talosctl puts on its CAs."""
    start = _aware(now)
    key = new_key(key_type)
    subject = _name(common_name, organizations)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(_key_usage(digital_signature=True, cert_sign=True), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier(os.urandom(20)), critical=False)
        .sign(key, _sign_hash(key))
    )
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), talos_key_pem(key))


def _key_usage(*, digital_signature: bool = False, key_encipherment: bool = False, cert_sign: bool = False):
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _authority_key_id(ca_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    """Point at the CA's own SubjectKeyId: Talos CAs use a random one, and OpenSSL chain
    building matches AKI against it, so deriving it from the public key would break verification."""
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key())  # type: ignore[arg-type]
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def issue_cert(
    ca: CertKey,
    *,
    common_name: str | None = None,
    organizations: Iterable[str] = (),
    dns_names: Iterable[str] = (),
    ip_addresses: Iterable[str] = (),
    server: bool = False,
    client: bool = False,
    days: int = 365,
    key_type: KeyType = "ed25519",
    now: dt.datetime | None = None,
    lifetime: dt.timedelta | None = None,
) -> CertKey:
    """Leaf certificate signed by `ca`; EKU lists exactly the roles asked for. Valid for `days`,
    or for `lifetime` when given (short-lived credentials for people).

    The subject must differ from the CA's: a leaf whose subject equals its issuer is read
    as self-signed by verifiers and breaks chain building.
    """
    if not (server or client):
        raise ValueError("a leaf certificate needs server=True, client=True or both")
    ca_cert = load_certificate(ca.crt)
    ca_key = load_private_key(ca.key)
    subject = _name(common_name, organizations)
    if subject == ca_cert.subject:
        raise ValueError("leaf subject must differ from the CA subject")
    start = _aware(now)
    key = new_key(key_type)
    eku = [o for o, on in ((ExtendedKeyUsageOID.SERVER_AUTH, server), (ExtendedKeyUsageOID.CLIENT_AUTH, client)) if on]
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(start)
        .not_valid_after(start + (lifetime if lifetime is not None else dt.timedelta(days=days)))
        .add_extension(
            _key_usage(digital_signature=True, key_encipherment=isinstance(key, rsa.RSAPrivateKey)), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage(eku), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_authority_key_id(ca_cert), critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, _sign_hash(ca_key))
    return CertKey(cert.public_bytes(serialization.Encoding.PEM), talos_key_pem(key))
