"""The emulated node's gRPC server: grpclib's, able to drop its open connections as a rebooting
machine does."""

from __future__ import annotations

import weakref

from grpclib.server import Server


class DroppingServer(Server):
    """grpclib Server that can drop its open connections, as a rebooting machine does.
    (`_protocol_factory` is grpclib's per-connection hook; grpclib is pinned.)"""

    def __init__(self, handlers) -> None:
        super().__init__(handlers)
        self.protocols: weakref.WeakSet = weakref.WeakSet()

    def _protocol_factory(self):  # type: ignore[override]
        protocol = super()._protocol_factory()
        self.protocols.add(protocol)
        return protocol

    def drop_connections(self) -> None:
        for protocol in list(self.protocols):
            connection = getattr(protocol, "connection", None)
            if connection is not None:
                connection.close()
