"""How we reach a Talos node: TLS settings, certificate pinning, gRPC metadata.

Two kinds of connection, as talosctl has:
- maintenance: server-only TLS to the node's ephemeral self-issued certificate, verification
  off (there is nothing to verify it against) and never a client certificate. The SPKI SHA-256
  of the first certificate seen is pinned for the life of the transport object, so a different
  machine answering at the same address later is refused instead of receiving a config full
  of secrets.
- authenticated: mTLS from a talosconfig; the OS CA is the only trust root and the client
  certificate carries the role. When the node is reached through another endpoint, the `node`
  metadata key asks that endpoint's apid to proxy.

The transport is grpclib over Python's ssl: real Talos presents Ed25519 certificates, which
grpcio's BoringSSL cannot handshake with (see shared/reference/python-grpc-tls.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import ssl
import tempfile
import threading
from typing import AsyncIterator, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpclib.client import Channel

from kontinuum.talos import pki
from kontinuum.talos.errors import CertificatePinMismatch
from kontinuum.talos.talosconfig import APID_PORT


def spki_sha256(der_certificate: bytes) -> str:
    """Fingerprint of the certificate's public key, the form talosctl --cert-fingerprint uses."""
    cert = x509.load_der_x509_certificate(der_certificate)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).hexdigest()


def _client_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    return ctx


class _InspectingChannel(Channel):
    """A grpclib Channel that shows each new TLS connection's server certificate to a callback
    before any request is written on it.

    grpclib has no public hook for this; `_create_connection` is the single place a
    connection is made (grpclib 0.4.9, pinned in requirements.txt; the pinning test fails
    loudly if an upgrade moves it).
    """

    def __init__(self, host: str, port: int, *, ssl_context: ssl.SSLContext, on_certificate) -> None:
        super().__init__(host, port, ssl=ssl_context)
        self._on_certificate = on_certificate

    async def _create_connection(self):  # type: ignore[override]
        protocol = await super()._create_connection()
        transport = protocol.connection.get_peer()._transport
        ssl_object = transport.get_extra_info("ssl_object")
        try:
            self._on_certificate(ssl_object.getpeercert(binary_form=True) if ssl_object else None)
        except BaseException:
            protocol.connection.close()
            raise
        return protocol


async def tls_rejection(host: str, port: int, ctx: ssl.SSLContext, timeout: float) -> str | None:
    """Handshake, send nothing, and see whether the server accepts us.

    Under TLS 1.3 a server that rejects the client's certificate (or its absence) says so only
    after the handshake, with an alert or by closing, which grpclib reports as a lost
    connection. An HTTP/2 server that accepts us sends its SETTINGS frame at once. Returns
    why we were rejected, or None if we were accepted or it could not be told."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
            try:
                data = await reader.read(1)
            finally:
                writer.close()
    except ssl.SSLError as exc:
        return exc.reason or str(exc)
    except (OSError, TimeoutError):
        return None
    return None if data else "connection closed right after the TLS handshake"


class Transport(Protocol):
    """What the client needs from a connection description."""

    node: str
    maintenance: bool

    def channel(self) -> contextlib.AbstractAsyncContextManager[Channel]: ...

    def metadata(self) -> dict[str, str]: ...

    async def rejection(self, timeout: float) -> str | None: ...


class MaintenanceTransport:
    """Server-only TLS to a node in maintenance mode, with its certificate pinned on first use."""

    maintenance = True

    def __init__(self, address: str, *, port: int = APID_PORT, fingerprint: str | None = None) -> None:
        self.address = address
        self.port = port
        self.node = address
        self._pin = fingerprint
        self._lock = threading.Lock()
        ctx = _client_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the maintenance CA is ephemeral; the pin stands in for trust
        self._ssl = ctx

    @property
    def fingerprint(self) -> str | None:
        """SPKI SHA-256 of the node's certificate, once the first connection has seen it."""
        return self._pin

    def _check(self, der: bytes | None) -> None:
        if der is None:
            raise CertificatePinMismatch("the node presented no certificate")
        seen = spki_sha256(der)
        with self._lock:
            if self._pin is None:
                self._pin = seen
                return
            pinned = self._pin
        if seen != pinned:
            raise CertificatePinMismatch(
                f"certificate changed since first contact (pinned SPKI sha256 {pinned}, now {seen}); "
                "the machine may have rebooted into a new maintenance identity or another machine answers here",
                pinned=pinned, seen=seen,
            )

    @contextlib.asynccontextmanager
    async def channel(self) -> AsyncIterator[Channel]:
        ch = _InspectingChannel(self.address, self.port, ssl_context=self._ssl, on_certificate=self._check)
        try:
            yield ch
        finally:
            ch.close()

    def metadata(self) -> dict[str, str]:
        return {}

    async def rejection(self, timeout: float) -> str | None:
        """Why the node refuses a certificate-less client, if it does (it has left maintenance)."""
        return await tls_rejection(self.address, self.port, self._ssl, timeout)


def load_cert_chain(ctx: ssl.SSLContext, crt: bytes, key: bytes) -> None:
    """Python's ssl reads certificates only from files: write them to a private directory,
    load, and delete at once. Talos's `ED25519 PRIVATE KEY` label is converted to PKCS#8."""
    with tempfile.TemporaryDirectory(prefix="kontinuum-talos-") as tmp:
        crt_path, key_path = os.path.join(tmp, "crt.pem"), os.path.join(tmp, "key.pem")
        for path, data in ((crt_path, crt), (key_path, pki.to_standard_pem(key))):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(crt_path, key_path)


class MutualTlsTransport:
    """mTLS to a configured node: trust only `ca`, authenticate with `crt`/`key`."""

    maintenance = False

    def __init__(
        self,
        endpoint: str,
        *,
        ca: bytes,
        crt: bytes,
        key: bytes,
        node: str | None = None,
        port: int = APID_PORT,
    ) -> None:
        if not (ca and crt and key):
            raise ValueError("an authenticated Talos connection needs the CA, a client certificate and its key")
        self.endpoint = endpoint
        self.port = port
        self.node = node or endpoint
        self._target = node if node and node != endpoint else None
        ctx = _client_context()
        ctx.load_verify_locations(cadata=ca.decode())
        load_cert_chain(ctx, crt, key)
        self._ssl = ctx

    @classmethod
    def from_talosconfig(cls, config, *, node: str | None = None, endpoint: str | None = None, port: int = APID_PORT):
        """From a parsed talosconfig (kontinuum.talos.talosconfig.TalosConfig). The endpoint
        defaults to the first of the context's endpoints; the node to its first node, if any."""
        endpoint = endpoint or (config.endpoints[0] if config.endpoints else None)
        if not endpoint:
            raise ValueError(f"talosconfig context {config.context!r} has no endpoints")
        node = node or (config.nodes[0] if config.nodes else None)
        return cls(endpoint, ca=config.ca, crt=config.crt, key=config.key, node=node, port=port)

    @contextlib.asynccontextmanager
    async def channel(self) -> AsyncIterator[Channel]:
        ch = Channel(self.endpoint, self.port, ssl=self._ssl)
        try:
            yield ch
        finally:
            ch.close()

    def metadata(self) -> dict[str, str]:
        return {"node": self._target} if self._target else {}

    async def rejection(self, timeout: float) -> str | None:
        """Why the endpoint refuses our client certificate, if it does (wrong CA, bad usage)."""
        return await tls_rejection(self.endpoint, self.port, self._ssl, timeout)
