"""The lab's load balancer in front of a cluster's apiservers (lab/endpoint_proxy.py) over real
sockets: connections go round robin to the backends reported up, a refusing backend is skipped,
a backend that dies ends its connections for their clients, and with no backend up a connection
is closed at once. Addresses 127.0.64.40-49 are this module's own."""

from __future__ import annotations

import socket
import threading

import pytest

from lab.endpoint_proxy import TcpProxy

PROXY, BACKENDS = "127.0.64.40", ["127.0.64.41", "127.0.64.42", "127.0.64.43"]


class Echo:
    """A backend that answers each line with its own address and the line."""

    def __init__(self, address: str):
        self.address = address
        self.sock = socket.create_server((address, 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                while data := conn.recv(1024):
                    conn.sendall(self.address.encode() + b" " + data)
            except OSError:
                pass

    def die(self):
        """The process is gone: its listener and connections close."""
        for c in [self.sock, *self.conns]:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()


def ask(port: int, line: bytes = b"hi") -> bytes:
    with socket.create_connection((PROXY, port), timeout=5) as s:
        s.sendall(line)
        return s.recv(1024)


@pytest.fixture
def backends():
    servers = [Echo(a) for a in BACKENDS]
    yield servers
    for s in servers:
        s.die()


def test_round_robin_over_the_backends_that_are_up_skipping_one_that_refuses(backends):
    up = [(b.address, b.port) for b in backends]
    proxy = TcpProxy("t", PROXY, 0, lambda: up).start()
    try:
        answered = {ask(proxy.port).split()[0].decode() for _ in range(6)}
        assert answered == set(BACKENDS)
        backends[1].die()  # refuses now, but still reported up: the next one answers
        answers = [ask(proxy.port).split()[0].decode() for _ in range(6)]
        assert BACKENDS[1] not in answers and set(answers) == {BACKENDS[0], BACKENDS[2]}
    finally:
        proxy.stop()


def test_a_dying_backend_ends_its_connections_and_the_next_goes_elsewhere(backends):
    up = [(backends[0].address, backends[0].port)]
    proxy = TcpProxy("t", PROXY, 0, lambda: list(up)).start()
    try:
        with socket.create_connection((PROXY, proxy.port), timeout=5) as held:
            held.sendall(b"one")
            assert held.recv(1024) == BACKENDS[0].encode() + b" one"
            backends[0].die()
            up[:] = [(backends[2].address, backends[2].port)]
            assert held.recv(1024) == b""  # the client sees its connection end
        assert ask(proxy.port) == BACKENDS[2].encode() + b" hi"
    finally:
        proxy.stop()


def test_no_backend_up_closes_the_connection_and_stop_frees_the_port():
    proxy = TcpProxy("t", PROXY, 0, lambda: []).start()
    port = proxy.port
    assert ask(port) == b""
    proxy.stop()
    with socket.socket() as s:
        assert s.connect_ex((PROXY, port)) != 0  # refused once stopped
    with pytest.raises(RuntimeError, match="cannot listen on"):
        with socket.create_server((PROXY, 0)) as taken:
            TcpProxy("t", PROXY, taken.getsockname()[1]).start()
