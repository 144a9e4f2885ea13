"""The lab as one process: hub, emulated Talos nodes, control planes for their clusters, stand-ins.

    python -m lab.supervisor --state-dir .state/lab [--nodes 2] [--first-address 127.0.10.11]
        [--hub-address 127.0.0.2] [--acme-address 127.0.10.2] [--ttl 14400]

With an ACME address the lab runs the real parts of certificate issuance: Pebble there and its
DNS server at the next address (lab/acme.py), real cert-manager in every cluster
(lab/certmanager.py), and links to the pinned upstream charts and CRDs under
<state-dir>/upstream/ (lab/upstream.py) for the stack config to name.

`python -m lab up` starts this detached; `python -m lab down` sends it SIGTERM. It stops every
process it started (by pid; they also die with it through PDEATHSIG) on SIGTERM/SIGINT or when
its time-to-live runs out, whichever comes first, so a forgotten lab does not outlive its use.

While it runs it keeps <state-dir>/status.json current (phase, addresses, clusters and the pid
of every child process) for `lab status` and for `lab down` to verify nothing is left behind.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import logging
import os
import resource
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy imports wait until a lab starts: `python -m lab status` stays quick
    from lab.cluster_manager import ClusterManager
    from lab.talos_node.lab import Lab

CONTROL_PORT = 50080  # lab.talos_node.control.CONTROL_PORT
APID_PORT = 50000  # lab.talos_node.node.APID_PORT

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STATE = ROOT / ".state" / "lab"
DEFAULT_NODES = 2
DEFAULT_FIRST_ADDRESS = "127.0.10.11"
DEFAULT_HUB_ADDRESS = "127.0.0.2"
DEFAULT_ACME_ADDRESS = "127.0.10.2"  # and its DNS server on 127.0.10.3
ACME_DIR = "acme"
UPSTREAM_DIR = "upstream"
DEFAULT_TTL = 4 * 3600.0
STATUS_EVERY = 2.0  # seconds between status.json refreshes

PID_FILE = "supervisor.pid"
STATUS_FILE = "status.json"
USAGE_FILE = "usage.json"  # written when the lab stops
HUB_DIR = "hub"
HUB_KUBECONFIG = "kubeconfig"  # .state/lab/hub/kubeconfig: what stacks/Pulumi.lab.yaml reads

log = logging.getLogger("lab.supervisor")


def check_loopback(address: str) -> str:
    """The lab binds 127.0.0.0/8 only (as lab.talos_node.node.check_loopback, without its imports)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"{address!r} is not an IP address; the lab binds 127.0.0.0/8 only") from None
    if ip.version != 4 or not ip.is_loopback:
        raise ValueError(f"{address} is outside 127.0.0.0/8; the lab binds loopback addresses only")
    return str(ip)


def node_addresses(first: str, count: int) -> list[str]:
    start = ipaddress.ip_address(check_loopback(first))
    return [check_loopback(str(start + i)) for i in range(count)]


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Supervisor:
    def __init__(self, state_dir: Path, addresses: list[str], *, hub_address: str | None, ttl: float,
                 reboot_delay: float = 1.0, control_port: int = CONTROL_PORT, acme_address: str | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.acme_address = acme_address
        self.acme = None
        self.addresses = addresses
        self.hub_address = hub_address
        self.ttl = ttl
        self.reboot_delay = reboot_delay
        self.control_port = control_port
        self.stop_event = threading.Event()
        self.phase = "starting"
        self.error: str | None = None
        self.started = time.time()
        self.hub = None
        self.lab: Lab | None = None
        self.manager: ClusterManager | None = None
        self.controls: list = []

    @property
    def hub_kubeconfig(self) -> Path:
        return self.state_dir / HUB_DIR / HUB_KUBECONFIG

    # -- status -----------------------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.hub is not None:
            out.update({f"hub/{p.name}": p.pid for p in self.hub.control_plane.processes if p.running() and p.pid})
        if self.acme is not None:
            out.update({f"acme/{p.name}": p.pid for p in self.acme.processes() if p.running() and p.pid})
        if self.manager is not None:
            out.update(self.manager.pids())
        return out

    def status(self) -> dict:
        nodes = []
        for node in self.lab.nodes if self.lab else []:
            nodes.append({"address": node.address, "port": APID_PORT, "mode": node.mode, "hostname": node.hostname,
                          "cluster": node.config.cluster_name if node.config else None,
                          "control": f"http://{node.address}:{self.control_port}/"})
        clusters = []
        if self.manager is not None:
            with self.manager._lock:
                runners = list(self.manager.runners.values())
            for r in runners:
                clusters.append({"name": r.name, "endpoint": r.config.endpoint, "apiserver": f"https://{r.address}:{r.config.endpoint_port}",
                                 "state": r.state, "kubeconfig": str(r.kubeconfig_path),
                                 "nodes": sorted(r.node_sync.registered.values())})
        return {
            "phase": self.phase,
            "error": self.error,
            "pid": os.getpid(),
            "started": dt.datetime.fromtimestamp(self.started, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ttl_deadline": dt.datetime.fromtimestamp(self.started + self.ttl, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "updated": _now(),
            "hub": {"address": self.hub_address, "server": self.hub.server if self.hub else None,
                    "kubeconfig": str(self.hub_kubeconfig)} if self.hub_address else None,
            "acme": {"directory": self.acme.directory, "nameserver": self.acme.nameserver,
                     "caBundle": str(self.state_dir / ACME_DIR / "ca.crt")} if self.acme else None,
            "nodes": nodes,
            "clusters": clusters,
            "pids": self.pids(),
        }

    def write_status(self) -> None:
        try:
            write_json(self.state_dir / STATUS_FILE, self.status())
        except Exception:  # noqa: BLE001 - status is best effort; never take the lab down for it
            log.exception("could not write status")

    # -- lifecycle --------------------------------------------------------------------------

    def run(self) -> int:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / PID_FILE).write_text(f"{os.getpid()}\n")
        deadline = self.started + self.ttl
        try:
            self.write_status()
            self._start()
            self.phase = "ready"
            self.write_status()
            log.info("lab ready: nodes %s, hub %s", ", ".join(self.addresses), self.hub_address or "none")
            while not self.stop_event.wait(min(STATUS_EVERY, max(0.0, deadline - time.time()))):
                if time.time() >= deadline:
                    log.info("time-to-live of %.0f s reached; stopping the lab", self.ttl)
                    break
                self.write_status()
            return 0
        except BaseException as e:  # noqa: BLE001 - report, then stop what started
            if self.stop_event.is_set():
                log.info("stopped while starting")
                return 0
            self.phase, self.error = "failed", f"{type(e).__name__}: {e}"
            log.exception("lab failed")
            return 1
        finally:
            self._stop()

    def _start(self) -> None:
        from lab.cluster_manager import ClusterManager
        from lab.talos_node import control
        from lab.talos_node.lab import Lab

        if self.hub_address:
            from lab.hub import Hub

            self.hub = Hub(self.state_dir / HUB_DIR, address=self.hub_address)
            self.hub.start()
            tmp = self.hub_kubeconfig.with_name(HUB_KUBECONFIG + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.hub.kubeconfig)
            os.replace(tmp, self.hub_kubeconfig)
            self.write_status()
        if self.acme_address:
            from lab import upstream
            from lab.acme import Acme

            upstream.link(self.state_dir / UPSTREAM_DIR)
            dns = str(ipaddress.ip_address(self.acme_address) + 1)
            self.acme = Acme(self.state_dir / ACME_DIR, address=check_loopback(self.acme_address),
                             dns_address=check_loopback(dns)).start()
            self.write_status()
        self.lab = Lab(reboot_delay=self.reboot_delay).start()
        self.manager = ClusterManager(self.lab.clusters, self.state_dir / "clusters",
                                      hub_kubeconfig=self.hub_kubeconfig if self.hub else None, acme=self.acme).start()
        for address in self.addresses:
            node = self.lab.add_node(address)
            self.controls.append(control.serve(node, self.control_port))
            self.write_status()

    def _stop(self) -> None:
        if self.phase != "failed":
            self.phase = "stopping"
        self.write_status()
        steps = [
            ("clusters", lambda: self.manager and self.manager.stop()),
            ("node control endpoints", self._close_controls),
            ("Talos nodes", lambda: self.lab and self.lab.stop()),
            ("hub", lambda: self.hub and self.hub.stop()),
            ("ACME server", lambda: self.acme and self.acme.stop()),
        ]
        for what, step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001 - stop the rest regardless
                log.exception("stopping %s failed", what)
        if self.phase != "failed":
            self.phase = "stopped"
        self.write_status()
        (self.state_dir / PID_FILE).unlink(missing_ok=True)
        self._write_usage()
        log.info("lab stopped")

    def _write_usage(self) -> None:
        """What the lab cost, for the suite's figures (bench/suite.py): CPU seconds of this
        process and of every process it started and reaped (control planes, kwok, controllers)."""
        own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            write_json(self.state_dir / USAGE_FILE, {
                "wall": round(time.time() - self.started, 1),
                "supervisor_cpu": round(own.ru_utime + own.ru_stime, 1),
                "processes_cpu": round(reaped.ru_utime + reaped.ru_stime, 1),
                "clusters_started": self.manager.started if self.manager else 0,
            })
        except OSError:
            log.exception("could not write %s", USAGE_FILE)

    def _close_controls(self) -> None:
        for server in self.controls:
            server.shutdown()
            server.server_close()
        self.controls.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.supervisor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE)
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    parser.add_argument("--first-address", default=DEFAULT_FIRST_ADDRESS)
    parser.add_argument("--hub-address", default=DEFAULT_HUB_ADDRESS, help="'' runs no hub")
    parser.add_argument("--acme-address", default="", help="Pebble's address (its DNS at the next one); '' runs none")
    parser.add_argument("--ttl", type=float, default=DEFAULT_TTL, help="seconds until the lab stops by itself")
    parser.add_argument("--reboot-delay", type=float, default=1.0)
    parser.add_argument("--control-port", type=int, default=CONTROL_PORT)
    args = parser.parse_args(argv)
    try:
        addresses = node_addresses(args.first_address, args.nodes)
        if args.hub_address:
            check_loopback(args.hub_address)
        if args.acme_address:
            check_loopback(str(ipaddress.ip_address(check_loopback(args.acme_address)) + 1))
    except ValueError as e:
        parser.error(str(e))
    if shutil.which("kube-apiserver") is None:
        print("lab: kube-apiserver is not on PATH; run `make tools` (python -m lab up puts the tool directory first)",
              file=sys.stderr)
        return 2

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sup = Supervisor(args.state_dir.resolve(), addresses, hub_address=args.hub_address or None, ttl=args.ttl,
                     reboot_delay=args.reboot_delay, control_port=args.control_port,
                     acme_address=args.acme_address or None)

    def on_signal(signum, _frame):
        sup.stop_event.set()
        if sup.phase == "starting":  # don't wait for a slow start to finish: unwind it now
            raise SystemExit(f"stopped by signal {signum} while starting")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
