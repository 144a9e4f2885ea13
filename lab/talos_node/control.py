"""A tiny HTTP control endpoint for an emulated node running in its own process.

On http://<node address>:<control port>/ (loopback only, like the node):
    GET  /state          mode (off, maintenance, booting, configured, rebooting, crashed), version,
                         cluster, fingerprint, fault knobs, call counters, boot id, etcd members,
                         this node's etcd standing (member, removed, none; null unless a
                         configured control plane), its kubelet (service state, healthy, the boot
                         it started in), its MachineStatus (stage, ready, unmetConditions), the
                         Node readiness the lab handed it (node_ready), event log (JSON)
    POST /faults         JSON with any of latency, hang, refuse, reboot_delay, kubelet_delay, netboot,
                         install_delay, upgrade_fault ("", fail, rollback, hang),
                         pull_fault (a pull whose image reference contains it fails) and
                         fail_next: {"count": N, "status": "UNAVAILABLE", "message": "..."}
    POST /calls/reset    zero the call counters
    POST /reboot         power-cycle
    POST /crash          cut the power, disk intact: mode "crashed", event "crashed"; its Talos API
                         times out (never refuses), its kubelet stops, its etcd member stays
                         listed but unreachable (EmulatedNode.crash)
    POST /power-on       boot a node that a reset powered off or that crashed, with its config
"""

from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from grpclib.const import Status

from lab.talos_node import machine_status
from lab.talos_node.node import EmulatedNode
from lab.talos_node.upgrade import UPGRADE_FAULTS

CONTROL_PORT = 50080
_KNOBS = {"latency": float, "hang": bool, "refuse": bool, "reboot_delay": float, "kubelet_delay": float,
          "netboot": bool,
          "install_delay": float, "upgrade_fault": str, "pull_fault": str}


def state(node: EmulatedNode) -> dict:
    faults = asdict(node.faults)
    faults["fail_status"] = node.faults.fail_status.name
    return {
        "address": node.address,
        "mode": node.mode,
        "talos_version": node.talos_version,
        "cluster_key": node.cluster_key,
        "fingerprint": node.fingerprint,
        "faults": faults,
        "calls": node.calls,
        "boot_id": node.boot_id,
        "etcd_members": sorted(m.address for m in node.registry.state(node.cluster_key).members.values())
        if node.cluster_key else [],
        "etcd": node.registry.etcd_standing(node.cluster_key, node.address)
        if node.cluster_key and node.is_control_plane else None,
        "kubelet": {"state": node.kubelet.state, "healthy": node.kubelet.healthy, "boot_id": node.kubelet.boot_id},
        "machine_status": dict(zip(("stage", "ready", "unmetConditions"), machine_status.status(node))),
        "node_ready": node.node_ready,
        "events": node.event_log(),
    }


def apply_faults(node: EmulatedNode, body: dict) -> None:
    unknown = set(body) - set(_KNOBS) - {"fail_next"}
    if unknown:
        raise ValueError(f"unknown fault knobs: {', '.join(sorted(unknown))}")
    changes = {name: _KNOBS[name](value) for name, value in body.items() if name in _KNOBS}
    if changes.get("upgrade_fault", "") not in UPGRADE_FAULTS:
        raise ValueError(f"upgrade_fault must be one of {', '.join(map(repr, UPGRADE_FAULTS))}")
    if "fail_next" in body:
        spec = body["fail_next"]
        changes.update(
            fail_next=int(spec.get("count", 1)),
            fail_status=Status[str(spec.get("status", "UNAVAILABLE")).upper()],
            fail_message=str(spec.get("message", "injected failure")),
        )
    node.set_faults(**changes)


def _handler(node: EmulatedNode) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet: tests poll this
            pass

        def _reply(self, code: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/state":
                self._reply(200, state(node))
            else:
                self._reply(404, {"error": f"no such endpoint {self.path}"})

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/faults":
                    apply_faults(node, body)
                elif self.path == "/calls/reset":
                    node.reset_calls()
                elif self.path == "/reboot":
                    node.reboot()
                elif self.path == "/power-on":
                    node.power_on()
                elif self.path == "/crash":
                    node.crash()
                else:
                    self._reply(404, {"error": f"no such endpoint {self.path}"})
                    return
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self._reply(400, {"error": str(exc)})
                return
            self._reply(200, state(node))

    return Handler


def serve(node: EmulatedNode, port: int = CONTROL_PORT) -> ThreadingHTTPServer:
    """Start the control endpoint on the node's own address in a daemon thread."""
    server = ThreadingHTTPServer((node.address, port), _handler(node))
    threading.Thread(target=server.serve_forever, name=f"talos-control-{node.address}", daemon=True).start()
    return server


# --- client side: what tests and benchmarks call ------------------------------------------


def request(address: str, path: str, body: dict | None = None, *, port: int = CONTROL_PORT,
            timeout: float = 10.0) -> dict:
    """GET `path` (or POST `body` as JSON) on a node's control endpoint; bounded by `timeout`."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{address}:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"}, method="GET" if data is None else "POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    return json.loads(raw) if raw.strip() else {}


def read_state(address: str, **kw) -> dict:
    return request(address, "/state", **kw)


def set_faults(address: str, **knobs) -> None:
    request(address, "/faults", knobs)


def reset_calls(address: str) -> None:
    request(address, "/calls/reset", {})


def crash(address: str, **kw) -> dict:
    """Crash the node (POST /crash); returns its state afterwards."""
    return request(address, "/crash", {}, **kw)


def power_on(address: str, **kw) -> dict:
    """Boot a crashed or powered-off node (POST /power-on); returns its state once it listens."""
    return request(address, "/power-on", {}, **kw)
