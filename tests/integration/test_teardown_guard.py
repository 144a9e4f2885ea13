"""TeardownGuard: a dead zone API server fails teardown once, bounded, naming the way out;
a live one (whatever it answers) or the escape hatch lets teardown go on."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from kontinuum.talos.waits import WaitBounds
from providers.teardown_guard import TeardownGuardProvider, ZoneClusterUnreachable, check_guard, ensure_reachable

ADDRESS = "127.0.0.7"
REMEDY = "set `teardown: {skipUnreachableCluster: true}` on zone d"


def kubeconfig(server: str) -> str:
    return (f"apiVersion: v1\nkind: Config\nclusters: [{{name: z, cluster: {{server: '{server}'}}}}]\n"
            "users: [{name: z, user: {token: t}}]\ncontexts: [{name: z, context: {cluster: z, user: z}}]\n"
            "current-context: z\n")


def closed_port() -> int:
    s = socket.socket()
    s.bind((ADDRESS, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def props(server: str, **over) -> dict:
    return {"kubeconfig": kubeconfig(server), "zone": "lab-d", "timeout": 2.0, "skipUnreachable": False,
            "remedy": REMEDY, **over}


def test_dead_api_server_fails_bounded_naming_the_server_and_the_hatch():
    server = f"https://{ADDRESS}:{closed_port()}"
    t0 = time.monotonic()
    with pytest.raises(ZoneClusterUnreachable) as e:
        TeardownGuardProvider().delete("lab-d", props(server))
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert msg.startswith(f"zone lab-d: its cluster's API server {server} did not answer within 2 s (")
    assert "Connection refused" in msg and "object at 0x" not in msg
    assert "bring it back and run again" in msg and msg.endswith(REMEDY)


def test_escape_hatch_skips_the_probe():
    calls = []
    ensure_reachable(props("https://127.0.0.7:1", skipUnreachable=True), probe=lambda *a: calls.append(a))
    assert calls == []


def test_any_http_answer_counts_as_reachable():
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_):
            pass

    httpd = http.server.HTTPServer((ADDRESS, 0), NotFound)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        TeardownGuardProvider().delete("lab-d", props(f"http://{ADDRESS}:{httpd.server_port}"))
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_cluster_coming_back_within_the_bound_passes():
    answers = iter(["ConnectionRefusedError: down", "ConnectionRefusedError: down", None])
    seen = []

    def probe(_kubeconfig, timeout):
        seen.append(timeout)
        return next(answers)

    ensure_reachable(props("https://x", timeout=30.0), probe=probe, sleep=lambda _s: None,
                     bounds=WaitBounds(first_pause=0.01, max_pause=0.01))  # noqa: E501
    assert len(seen) == 3 and all(0 < t <= 5.0 for t in seen)


def test_check_names_missing_inputs():
    failures = {f.property: f.reason for f in check_guard({"timeout": 0})}
    assert set(failures) == {"kubeconfig", "zone", "remedy", "timeout"}
