"""A TCP load balancer in front of a cluster's apiservers, as an operator puts one in front of an
HA zone's control planes (and as Talos's KubePrism does on every node).

Each accepted connection goes to the next backend, round robin over those the owner reports up
(backends(), read per connection), trying the others when one refuses; the connect is bounded.
Bytes are copied both ways until either side ends, so when a backend dies its connections end
for their clients too, as behind a real load balancer, and the client's next connection goes to
another backend. With no backend up, a connection is accepted and closed at once.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from typing import Callable, Sequence

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 2.0  # seconds to connect to one backend
BUFFER = 65536

Backends = Callable[[], Sequence[tuple[str, int]]]


class TcpProxy:
    """Listens on (address, port); port 0 picks a free one (see .port once started)."""

    def __init__(self, name: str, address: str, port: int, backends: Backends = lambda: (), *,
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.name = name
        self.address = address
        self.port = port
        self.backends = backends
        self.connect_timeout = connect_timeout
        self.accepted = 0  # connections accepted, for tests and reports
        self._turn = itertools.count()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"TcpProxy({self.name} on {self.address}:{self.port})"

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    def start(self) -> "TcpProxy":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.address, self.port))
            listener.listen(128)
        except OSError as e:
            listener.close()
            raise RuntimeError(f"{self.name}: cannot listen on {self.address}:{self.port} ({e.strerror}); "
                               "is another process serving that address?") from None
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name=f"proxy-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening and end every open connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            except OSError:
                pass
            listener.close()
        with self._lock:
            open_, self._open = list(self._open), set()
        for s in open_:
            _close(s)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def listening(self) -> bool:
        return self._listener is not None

    def _accept(self) -> None:
        while (listener := self._listener) is not None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # stopped
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), name=f"proxy-{self.name}-conn", daemon=True).start()

    def _connect(self) -> socket.socket | None:
        backends = list(self.backends())
        if not backends:
            return None
        first = next(self._turn) % len(backends)
        for address in backends[first:] + backends[:first]:
            try:
                upstream = socket.create_connection(address, timeout=self.connect_timeout)
            except OSError:
                continue  # refused or timed out: the next one
            upstream.settimeout(None)
            return upstream
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None or self._listener is None:
            _close(client)
            if upstream is not None:
                _close(upstream)
            return
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._open.update((client, upstream))
        done = threading.Event()  # set by the first direction that ends
        back = threading.Thread(target=self._pump, args=(upstream, client, done), daemon=True,
                                name=f"proxy-{self.name}-back")
        back.start()
        self._pump(client, upstream, done)
        back.join()
        with self._lock:
            self._open.difference_update((client, upstream))
        _close(client)
        _close(upstream)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, done: threading.Event) -> None:
        """Copy src → dst. At src's end of stream, pass the half-close on; on an error (a reset, a
        closed socket), end both directions."""
        try:
            while data := src.recv(BUFFER):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
            if not done.is_set():
                done.set()
                return  # the other direction may still carry a reply
        except OSError:
            pass
        done.set()
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
