"""A lab of the benchmark's own, and converged N-zone stacks on it.

The bench lab never shares anything with a lab someone else runs on this machine: its own
state directory (bench/out/lab-*), its own loopback range for the Talos nodes (127.0.30.11
and up) and its own hub address (127.0.0.30). It is driven through `python -m lab` like any
user's, and it always goes down again (`python -m lab down`), also when a run fails.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench import common, proctree
from lab.talos_node import control

FIRST_NODE = ipaddress.ip_address("127.0.30.11")
HUB_ADDRESS = "127.0.0.30"
LAB_TTL = 3600.0  # a forgotten bench lab stops by itself
UP_TIMEOUT = 300.0
MUTATING = ("ApplyConfiguration", "Bootstrap", "Reset", "Upgrade")  # plus every Etcd* method


def is_mutating(method: str) -> bool:
    return method in MUTATING or method.startswith("Etcd")


def lab_usable() -> str | None:
    """None when the lab can start here, else why not."""
    missing = common.missing_tools("pulumi", "pulumi-language-python", "pulumi-resource-kubernetes", "etcd",
                                   "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
    if missing:
        return f"pinned tools not built yet: {', '.join(missing)} (tools/install.sh --print-bin)"
    for module in ("lab/__main__.py", "lab/supervisor.py", "lab/clusters.py"):
        if not (common.ROOT / module).exists():
            return f"{module} is missing: the embedded lab has not landed"
    return None


# The lab's memory grows over seconds (control planes starting): sampled every half second, RSS
# only, since reading 50 processes' /proc ten times a second took a quarter of a core at 8 zones.
LAB_SAMPLE_EVERY = 0.5


class BenchLab:
    def __init__(self, nodes: int, state_dir: Path, log=print):
        self.nodes = nodes
        self.state_dir = state_dir
        self.addresses = [str(FIRST_NODE + i) for i in range(nodes)]
        self.log = log
        self.pid: int | None = None
        self.up_seconds: float | None = None
        self.status: dict = {}

    def _lab(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "lab", "--state-dir", str(self.state_dir), *args]
        return subprocess.run(argv, cwd=common.ROOT, capture_output=True, text=True, timeout=timeout)

    def up(self) -> "BenchLab":
        t0 = time.monotonic()
        r = self._lab("up", "--nodes", str(self.nodes), "--first-address", self.addresses[0],
                      "--hub-address", HUB_ADDRESS, "--ttl", str(LAB_TTL), "--timeout", str(UP_TIMEOUT),
                      timeout=UP_TIMEOUT + 150)
        self.up_seconds = time.monotonic() - t0
        if r.returncode != 0:
            self.down()
            raise RuntimeError(f"`python -m lab up --nodes {self.nodes}` exited {r.returncode}:\n"
                               + (r.stdout + r.stderr).strip()[-3000:])
        self.status = json.loads((self.state_dir / "status.json").read_text())
        self.pid = int(self.status["pid"])
        return self

    def down(self) -> str | None:
        """Stop the lab; returns a problem or None."""
        try:
            r = self._lab("down", timeout=400)
        except subprocess.TimeoutExpired:
            return "`python -m lab down` did not finish in 400 s"
        if r.returncode != 0:
            return f"`python -m lab down` exited {r.returncode}: {(r.stdout + r.stderr).strip()[-500:]}"
        return None

    @property
    def hub_kubeconfig(self) -> Path:
        return self.state_dir / "hub" / "kubeconfig"

    @property
    def supervisor_log(self) -> Path:
        return self.state_dir / "logs" / "supervisor.log"

    def rss_sampler(self) -> proctree.TreeSampler:
        """Summed RSS of the supervisor and everything it started (hub, control planes, kwok)."""
        return proctree.TreeSampler(roots=lambda: [self.pid], every=LAB_SAMPLE_EVERY, pss=False)

    def cpu_cores(self, seconds: float = 10.0) -> float:
        """CPU the lab's process tree uses while nothing drives it, in cores (CPU s per s)."""
        def total() -> float:
            out = 0.0
            for pid in proctree.descendants(self.pid):
                st = proctree.stat(pid)
                if st:
                    out += st[2]
            return out

        a, t0 = total(), time.monotonic()
        time.sleep(seconds)
        return (total() - a) / (time.monotonic() - t0)

    # -- emulated nodes' control endpoints -------------------------------------------------------

    def node_state(self, address: str) -> dict:
        return control.read_state(address)

    def reset_calls(self) -> None:
        for a in self.addresses:
            control.reset_calls(a)

    def calls(self) -> dict[str, int]:
        """Talos calls by method, summed over every node."""
        total: dict[str, int] = {}
        for a in self.addresses:
            for method, n in self.node_state(a).get("calls", {}).items():
                total[method] = total.get(method, 0) + n
        return total

    def reboot_delay(self) -> float:
        return float(self.node_state(self.addresses[0])["faults"]["reboot_delay"])

    def _cluster_lines(self):
        """(time.time(), cluster, rest) of each `cluster <name>: …` line of the supervisor log."""
        try:
            text = self.supervisor_log.read_text(errors="replace")
        except OSError:
            return
        for line in text.splitlines():
            m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: cluster (\S+)(.*)", line)
            if m:
                t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                yield t, m.group(2).rstrip(":"), m.group(3).strip()

    def control_plane_starts(self) -> dict[str, float]:
        """Seconds each cluster's control plane took to start, from the supervisor log:
        'bootstrapped; starting its control plane' → 'control plane at … running'."""
        start: dict[str, float] = {}
        done: dict[str, float] = {}
        for t, name, rest in self._cluster_lines():
            if "bootstrapped; starting its control plane" in rest:
                start[name] = t
            elif "stand-ins running" in rest and name in start:
                done[name] = t
        return {n: done[n] - start[n] for n in done}

    def cert_manager_times(self) -> dict[str, dict[str, float]]:
        """Per cluster, when (time.time()) the real cert-manager did its parts, from the lab's logs:
        `webhook` started, its API `works` (the startupapicheck stand-in's dry run admitted), and
        the zone's Certificate `ready` (cert-manager's own log: Ready set True)."""
        out: dict[str, dict[str, float]] = {}
        for t, name, rest in self._cluster_lines():
            if rest.startswith("started cert-manager webhook"):
                out.setdefault(name, {}).setdefault("webhook", t)
            elif "cert-manager's API works" in rest:
                out.setdefault(name, {}).setdefault("works", t)
        year = dt.datetime.now().year
        for name in out:
            for log in (self.state_dir / "clusters").glob(f"{name}-*/logs/cert-manager-controller.log"):
                for line in log.read_text(errors="replace").splitlines():
                    if 'condition="Ready"' in line and 'status="True"' in line and "certificate=" in line:
                        # klog stamps local time without the year, as the supervisor log does with it
                        out[name]["ready"] = dt.datetime.strptime(f"{year}{line[1:21]}", "%Y%m%d %H:%M:%S.%f").timestamp()
                        break
        return out


class ReadyzWatcher:
    """The lab's side of the kubeconfig phase: when each zone's kube-apiserver (the lab's, on
    <node>:6443) first serves HTTP at all (any status: the Kubeconfig resource's GET /version with
    admin credentials goes through from then on) and when /readyz first answers 200. Polls
    every 100 ms, unauthenticated."""

    def __init__(self, addresses: list[str], port: int = 6443, every: float = 0.1):
        self.addresses = addresses
        self.port = port
        self.every = every
        self.serving: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="readyz", daemon=True)
        self._ctx = ssl.create_default_context()
        self._ctx.check_hostname = False
        self._ctx.verify_mode = ssl.CERT_NONE

    def start(self) -> "ReadyzWatcher":
        self._thread.start()
        return self

    def _probe(self, address: str) -> int | None:
        try:
            with urllib.request.urlopen(f"https://{address}:{self.port}/readyz", context=self._ctx, timeout=1) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (OSError, ValueError):
            return None

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.ready) < len(self.addresses):
            for a in self.addresses:
                if a in self.ready:
                    continue
                code = self._probe(a)
                t = time.time()
                if code is not None:
                    self.serving.setdefault(a, t)
                if code == 200:
                    self.ready[a] = t
            self._stop.wait(self.every)

    def stop(self) -> "ReadyzWatcher":
        self._stop.set()
        self._thread.join(5)
        return self


@dataclass
class ZoneStack:
    """An N-zone stack of region `bench` on a BenchLab."""

    lab: BenchLab
    stack: object
    zones: list[str] = field(default_factory=list)


def zone_stack_config(lab: BenchLab, zones: int) -> dict:
    cfg = {"kontinuum:region": "bench", "kontinuum:hubKubeconfigFile": str(lab.hub_kubeconfig),
           **common.lab_addon_defaults(Path(lab.status["acme"]["caBundle"]))}
    cfg["kontinuum:zones"] = [{"zone": common.zone_name(i), "talosAddresses": [lab.addresses[i]]}
                              for i in range(zones)]
    return cfg


def new_zone_stack(lab: BenchLab, zones: int, work: Path, name: str) -> ZoneStack:
    project = common.kontinuum_project(work / "project")
    stack = common.new_stack(project, name, work / "state")
    common.write_config(stack, zone_stack_config(lab, zones))
    return ZoneStack(lab, stack, [common.zone_name(i) for i in range(zones)])
