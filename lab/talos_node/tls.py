"""The emulated node's TLS: Ed25519 certificates and client identities, as real Talos has.

- Maintenance: an ephemeral maintenance CA (made fresh on every boot) signs a server
  certificate for the node's IP; no client certificate is asked for.
- Configured: the OS CA from the applied config signs the server certificate (node IP,
  hostname and machine.certSANs; the key type follows the CA's), and client certificates are
  required and verified against machine.ca plus machine.acceptedCAs.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kontinuum.talos import pki
from kontinuum.talos.pki import CertKey, KeyType
from kontinuum.talos.transport import load_cert_chain, spki_sha256
from lab.talos_node.machineconfig import AppliedConfig, split_sans


def _key_type_of(ca: CertKey) -> KeyType:
    key = pki.load_private_key(ca.key)
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "ed25519"
    return "ecdsa" if isinstance(key, ec.EllipticCurvePrivateKey) else "rsa"


def _server_context(leaf: CertKey, chain: bytes = b"", client_cas: bytes = b"") -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])  # gRPC clients (grpc-go >= 1.67) insist on ALPN h2
    load_cert_chain(ctx, leaf.crt + chain, leaf.key)
    if client_cas:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=client_cas.decode())
    return ctx


def maintenance_context(address: str) -> tuple[ssl.SSLContext, str]:
    """A fresh maintenance identity; returns the context and the leaf's SPKI fingerprint."""
    ca = pki.new_ca(common_name="maintenance-ca", key_type="ed25519", days=1)
    leaf = pki.issue_cert(ca, common_name="maintenance", ip_addresses=[address], server=True, days=1)
    fingerprint = spki_sha256(pki.load_certificate(leaf.crt).public_bytes(Encoding.DER))
    return _server_context(leaf, chain=ca.crt), fingerprint


def configured_context(address: str, hostname: str, config: AppliedConfig, issuer: CertKey) -> ssl.SSLContext:
    """`issuer` is the OS CA with its key: the node's own on a control plane, a control
    plane's (trustd's) on a worker, whose config carries only the CA certificate."""
    ips, names = split_sans(config.cert_sans)
    leaf = pki.issue_cert(
        issuer,
        common_name=hostname,
        dns_names=[hostname, *names],
        ip_addresses=[address, *ips],
        server=True,
        key_type=_key_type_of(issuer),
    )
    return _server_context(leaf, client_cas=config.trusted_cas)


@dataclass(frozen=True)
class ClientIdentity:
    roles: frozenset[str]
    client_auth_only: bool  # ExtKeyUsage is exactly [ClientAuth], as newest apid demands


def client_identity(der: bytes) -> ClientIdentity:
    cert = x509.load_der_x509_certificate(der)
    roles = frozenset(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    try:
        usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usages = []
    return ClientIdentity(roles, usages == [ExtendedKeyUsageOID.CLIENT_AUTH])


def peer_certificate(stream) -> bytes | None:
    """DER of a gRPC stream's verified client certificate. grpclib's Peer.cert() returns only the
    parsed dict, which lacks ExtKeyUsage, so read the TLS object behind it (grpclib is pinned)."""
    ssl_object = stream.peer._transport.get_extra_info("ssl_object")
    return ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
