"""The emulated node's gRPC server: grpclib's, able to drop its open connections as a rebooting
machine does, and answering every method it does not serve with gRPC Unimplemented
(unimplemented.py)."""

from __future__ import annotations

import socket
import weakref

from grpclib.server import Server

from lab.talos_node import unimplemented

# A connection still in its TLS handshake when the machine goes down has no gRPC connection to
# drop yet; a real machine's apid closes it as it stops. Bounding the handshake ends it soon after.
# Not sooner than a loaded machine finishes a handshake (grpc-go's default bound is 120 s): at 2 s,
# handshakes under a load of 20 on 2 cores were cut off and clients saw "connection reset by peer".
HANDSHAKE_TIMEOUT = 10.0


class DroppingServer(Server):
    """grpclib Server that can drop its open connections, as a rebooting machine does.
    (`_protocol_factory`, `_mapping`, `_server` and `_server_closed_fut` are grpclib's; grpclib is pinned.)"""

    def __init__(self, handlers) -> None:
        super().__init__(handlers)
        self._mapping = unimplemented.Mapping(self._mapping)
        self.protocols: weakref.WeakSet = weakref.WeakSet()

    def _protocol_factory(self):  # type: ignore[override]
        protocol = super()._protocol_factory()
        self.protocols.add(protocol)
        return protocol

    async def start(self, host: str, port: int, *, ssl=None, reuse_address: bool = True) -> None:  # type: ignore[override]
        """grpclib's start, with the TLS handshake bounded."""
        if self._server is not None:
            raise RuntimeError("Server is already started")
        self._server = await self._loop.create_server(
            self._protocol_factory, host, port, family=socket.AF_INET, ssl=ssl, reuse_address=reuse_address,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT if ssl is not None else None)
        self._server_closed_fut = self._loop.create_future()

    def drop_connections(self) -> None:
        for protocol in list(self.protocols):
            connection = getattr(protocol, "connection", None)
            if connection is not None:
                connection.close()
