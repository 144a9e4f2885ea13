"""How one Talos machine fails to reach another's apid, in the words of grpc-go (what apid's
proxy and the cluster health checks report), and a dead host's port.

A powered-off machine that answers nothing makes a dial time out (grpc-go gives a connection
attempt at least 20 s, its minimum connect timeout); a machine that is up but not listening
refuses at once. On loopback a closed port is always refused, so a crashed emulated machine keeps
a `DeadPort` bound: a listening socket whose connections are never accepted, so clients hang in
the TLS handshake until their own deadline, as they would against a dead host.
"""

from __future__ import annotations

import socket

DIAL_TIMEOUT = 20.0  # seconds: grpc-go's minimum connect timeout, what apid's proxy waits for a dead host
_BACKLOG = 128  # connections the kernel completes before further SYNs go unanswered too


def refused(address: str, port: int) -> str:
    return f'connection error: desc = "transport: Error while dialing: dial tcp {address}:{port}: connect: connection refused"'


def timed_out(address: str, port: int) -> str:
    return f'connection error: desc = "transport: Error while dialing: dial tcp {address}:{port}: i/o timeout"'


def rpc_error(message: str) -> str:
    """A dial failure as a Go client prints it (status Unavailable)."""
    return f"rpc error: code = Unavailable desc = {message}"


class DeadPort:
    """address:port held open for a machine that lost power: it listens, never accepts, never answers."""

    def __init__(self, address: str, port: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(_BACKLOG)
        except BaseException:
            sock.close()
            raise
        self._sock: socket.socket | None = sock

    def close(self) -> None:
        """Free the port (queued connections are reset) for the machine's apid when it boots."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
