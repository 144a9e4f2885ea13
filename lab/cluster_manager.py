"""Which of the lab's emulated clusters have a running control plane: one ClusterRunner each.

A ClusterManager watches a ClusterRegistry. When a cluster is bootstrapped it starts a
ClusterRunner (lab/clusters.py) on the cluster's first etcd member still holding its config;
until that runner is up, the cluster's HealthCheck says the lab is still starting it. It stops the
runner when the cluster is no longer bootstrapped (its nodes were reset, its etcd lost), when the
hosting node was reset, or when a recovery bootstrapped a new generation (a new etcd: a new
runner). A runner that ended on its own is not restarted for the same generation.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

from lab.acme import Acme
from lab.cluster_health import CHECK_NODES_REPORT
from lab.clusters import POLL, ClusterRunner
from lab.talos_node.cluster import ClusterRegistry
from lab.talos_node.node import EmulatedNode

log = logging.getLogger(__name__)


class ClusterManager:
    """Starts a ClusterRunner for each bootstrapped cluster of a registry, stops it on reset."""

    def __init__(
        self,
        registry: ClusterRegistry,
        workdir: Path,
        *,
        hub_kubeconfig: Path | None = None,
        poll: float = 0.5,
        runner_poll: float = POLL,
        standins: bool = True,
        acme: Acme | None = None,
    ) -> None:
        self.registry = registry
        self.acme = acme
        self.workdir = Path(workdir)
        self.hub_kubeconfig = hub_kubeconfig
        self.poll = poll
        self.runner_poll = runner_poll
        self.standins = standins
        self.runners: dict[str, ClusterRunner] = {}
        self.started = 0  # control planes started, for the lab's usage record
        self._ended: set[str] = set()  # keys whose control plane stopped while still bootstrapped
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        registry.on_bootstrap(self._bootstrapped)

    def start(self) -> "ClusterManager":
        self._thread = threading.Thread(target=self._run, name="lab-cluster-manager", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 180.0) -> None:
        """Stop every cluster (all their processes, by pid) and the manager."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            runners = list(self.runners.values())
        for r in runners:
            r._stop.set()
        for r in runners:
            r.stop(timeout)

    def __enter__(self) -> "ClusterManager":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def runner(self, key: str) -> ClusterRunner | None:
        with self._lock:
            return self.runners.get(key)

    def pids(self) -> dict[str, int]:
        with self._lock:
            runners = list(self.runners.values())
        out: dict[str, int] = {}
        for r in runners:
            out.update(r.pids())
        return out

    def _bootstrapped(self, key: str) -> None:
        """Registry hook, on the emulator's loop: until the runner is up, HealthCheck says so."""
        self.registry.set_health_probe(
            key, lambda q: [(CHECK_NODES_REPORT, "the lab is still starting the cluster's kube-apiserver")]
        )
        self._wake.set()

    def _host(self, key: str) -> EmulatedNode | None:
        """The first etcd member still holding the cluster's config: the control plane's host."""
        for member in self.registry.state(key).members.values():
            node = self.registry.node(member.address)
            if node is not None and node.cluster_key == key and node.config is not None and node.is_control_plane:
                return node
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._reconcile()
            except Exception:  # noqa: BLE001 - keep managing the other clusters
                log.exception("cluster manager: reconcile failed")
            self._wake.wait(self.poll)
            self._wake.clear()

    def _reconcile(self) -> None:
        bootstrapped = set(self.registry.bootstrapped())
        self._ended &= bootstrapped  # a cluster that was forgotten may be bootstrapped anew
        with self._lock:
            runners = dict(self.runners)
        for key, runner in runners.items():
            # A new generation is a new etcd (a disaster recovery's bootstrap): a new control plane.
            gone = (key not in bootstrapped or runner.host.cluster_key != key
                    or runner.generation != self.registry.state(key).generation)
            if gone or not runner.alive:
                if gone:
                    log.info("cluster %s: its nodes were reset or its etcd was lost; stopping its control plane",
                             runner.name)
                runner.stop()
                with self._lock:
                    self.runners.pop(key, None)
                if key in bootstrapped and runner.generation == self.registry.state(key).generation:
                    self._ended.add(key)
        for key in bootstrapped - set(runners) - self._ended:
            host = self._host(key)
            if host is None or host.mode != "configured":
                continue
            digest = hashlib.sha256(key.encode()).hexdigest()[:8]
            runner = ClusterRunner(
                self.registry, key, host, self.workdir / f"{_safe(host.config.cluster_name)}-{digest}",
                hub_kubeconfig=self.hub_kubeconfig, poll=self.runner_poll, standins=self.standins, acme=self.acme,
            )
            with self._lock:
                self.runners[key] = runner
                self.started += 1
            runner.start()
            log.info("cluster %s (%s): bootstrapped; starting its control plane on %s", runner.name, key, runner.address)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "cluster"
