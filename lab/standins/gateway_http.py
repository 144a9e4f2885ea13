"""Envoy's HTTP listeners for the Gateway stand-in: one small HTTP server per (address, port).

Only the HTTP listeners are played (the ACME HTTP-01 path needs nothing else). A request is
routed by the HTTPRoutes attached to the Gateway (gateway_model.match); what a backend answers
comes from the stand-in's `answer` callback, since no backend pod really runs. A route-less
request gets Envoy's 404. Servers are daemon threads with a per-request socket timeout, and
stop when their address leaves the table or the stand-in stops.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

from lab.standins.gateway_model import Route, match

log = logging.getLogger("lab.standins.gateway")

REQUEST_TIMEOUT = 10.0  # seconds a client may take to send its request
STANDIN_HEADER = "X-Lab-Stand-In"

Answer = Callable[[Route, str, str], tuple[int, str]]  # (route, host, path) -> (status, body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], plane: "DataPlane"):
        self.plane = plane
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT

    def version_string(self) -> str:
        return "envoy"  # the Server header the real listener sends

    def log_message(self, fmt, *args):  # noqa: D401 - quiet: the lab log is for state changes
        log.debug("(lab stand-in) data plane %s: " + fmt, self.server.server_address, *args)

    def _respond(self, head_only: bool) -> None:
        address, port = self.server.server_address[:2]
        host = self.headers.get("Host", "")
        path = urlsplit(self.path).path or "/"
        status, body = self.server.plane.handle(address, port, host, path)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.send_header(STANDIN_HEADER, "gateway data plane (lab stand-in for Envoy)")
        self.end_headers()
        if not head_only:
            self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._respond(False)

    def do_HEAD(self):  # noqa: N802
        self._respond(True)


class DataPlane:
    """The listeners of every Gateway of one cluster, keyed by (address, port)."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self._table: dict[tuple[str, int], list[Route]] = {}
        self._servers: dict[tuple[str, int], tuple[_Server, threading.Thread]] = {}
        self.bind_errors: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    def listening(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(self._servers)

    def handle(self, address: str, port: int, host: str, path: str) -> tuple[int, str]:
        with self._lock:
            routes = self._table.get((address, port), [])
        route = match(routes, port, host, path)
        if route is None:
            return 404, ""
        try:
            return self.answer(route, host.rsplit(":", 1)[0] if host.count(":") == 1 else host, path)
        except Exception as e:  # noqa: BLE001 - a backend that cannot be read is Envoy's 503
            log.warning("(lab stand-in) data plane: backend of %s failed: %s", path, e)
            return 503, "upstream connect error or disconnect/reset before headers"

    def apply(self, table: dict[tuple[str, int], list[Route]]) -> None:
        """Listen exactly on the table's keys with their routes."""
        with self._lock:
            self._table = dict(table)
            gone = [k for k in self._servers if k not in table]
            new = [k for k in table if k not in self._servers]
        for key in gone:
            self._stop(key)
        for key in new:
            try:
                server = _Server(key, self)
            except OSError as e:
                if self.bind_errors.get(key) != str(e):
                    log.warning("(lab stand-in) data plane: cannot listen on %s:%d: %s", *key, e)
                self.bind_errors[key] = str(e)
                continue
            self.bind_errors.pop(key, None)
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                      name=f"standin-gateway-{key[0]}:{key[1]}", daemon=True)
            thread.start()
            with self._lock:
                self._servers[key] = (server, thread)
            log.info("(lab stand-in) data plane: listening on %s:%d", *key)

    def _stop(self, key: tuple[str, int]) -> None:
        with self._lock:
            entry = self._servers.pop(key, None)
        if entry is None:
            return
        server, thread = entry
        server.shutdown()
        server.server_close()
        thread.join(REQUEST_TIMEOUT)
        log.info("(lab stand-in) data plane: stopped listening on %s:%d", *key)

    def stop(self) -> None:
        for key in list(self._servers):
            self._stop(key)
