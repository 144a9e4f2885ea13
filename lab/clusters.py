"""Real Kubernetes control planes for the lab's emulated Talos clusters.

When an emulated cluster is bootstrapped, lab/cluster_manager.py starts a ClusterRunner, which runs
for that cluster:
- a ControlPlane (etcd, kube-controller-manager, kube-scheduler on the hosting node's address, and
  a kube-apiserver per control plane on its own address at the endpoint's port, down while its
  machine is: lab/cluster_apiservers.py) built from the CAs and keys in the applied machine
  config, with the endpoint served as a load balancer when it is no control plane's address, so
  the kubeconfig the Talos Kubeconfig RPC hands out works unchanged;
- kwok as every member's kubelet (lab/kwok), with the passes of lab/cluster_nodes.py: a Node per
  member, registered by the lab the way a kubelet registers itself, NotReady until the Cilium
  agent pod on it is Ready, reporting the kubelet version of its machine config, plus the control
  planes' static-pod mirror Pods with the images of their configs (lab/static_pods.py), and the
  objects of the Talos bootstrap manifests a control plane renders from its config that do not
  exist yet (lab/bootstrap_manifests.py: created once, as Talos does; only an upgrade's manifest
  sync updates them). The control plane itself is the one pinned Kubernetes version
  (tools/versions.env), whatever version the configs name;
- real cert-manager (lab/certmanager.py: its controller and webhook as processes) when the lab
  runs an ACME server (lab/acme.py), with the zone host records published in the lab's DNS
  (lab/zone_dns.py); without one, the certificate issuer stand-in instead;
- KubePrism on every machine (lab/pod_api.py), the lab stand-ins (Gateway/LB-IPAM/Envoy,
  kontinuum-server; cert issuer without ACME) against it, the pod-network verdicts
  (lab/pod_network.py) and, while their pods run, the real Flux Operator and Flux's own source- and
  kustomize-controller (lab/pod_processes.py);
- a health probe for the emulator's HealthCheck, read from the real apiserver.

A ClusterRunner owns one cluster. All of its child processes are started from the runner's own
thread and stopped by it (by pid), and they die with that thread if it ever ends (PDEATHSIG).
The control plane stops when every node of the cluster was reset, or the node that hosts it (its
etcd) was.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path
from typing import Optional

from kubernetes import client

from lab import kwok, service_proxy
from lab.acme import Acme
from lab.certmanager import CertManager
from lab.cluster_apiservers import ClusterApiservers
from lab.cluster_config import ClusterConfig, read_cluster_config
from lab.cluster_health import (
    CHECK_CILIUM,
    CHECK_CONTROL_PLANE,
    CHECK_NODES_READY,
    CHECK_NODES_REPORT,
    CNI_NAMESPACE,
    CNI_SELECTOR,
    cilium_problem,
    nodes_ready_problem,
    nodes_report_problem,
)
from lab.cluster_nodes import NodeSync
from lab import flux_controllers, flux_operator
from lab.pod_api import KubePrisms
from lab.pod_processes import PodNetwork, PodProcess
from lab.controlplane import ControlPlane
from lab.process import Managed
from lab.standins.loop import RevisionGate, api_client, describe
from lab.talos_node.cluster import ClusterRegistry, HealthQuery
from lab.talos_node.node import EmulatedNode
from lab.zone_dns import ZoneDns

log = logging.getLogger(__name__)

POLL = 1.0  # seconds between a runner's reconciliations
PROBE_TIMEOUT = 5.0  # seconds per API call of a health probe
START_ATTEMPTS = 3

Check = tuple[str, Optional[str]]


class ClusterRunner:
    """Runs one emulated cluster's control plane, kubelets and stand-ins from its own thread."""

    def __init__(
        self,
        registry: ClusterRegistry,
        key: str,
        host: EmulatedNode,
        workdir: Path,
        *,
        hub_kubeconfig: Path | None = None,
        poll: float = POLL,
        standins: bool = True,
        acme: Acme | None = None,
    ) -> None:
        assert host.config is not None
        self.registry = registry
        self.key = key
        self.host = host
        self.config = read_cluster_config(host.config.raw)
        self.name = self.config.name
        self.workdir = Path(workdir)
        self.hub_kubeconfig = hub_kubeconfig
        self.poll = poll
        self.with_standins = standins
        self.acme = acme
        self.cert_manager: CertManager | None = None
        self.service_proxy: service_proxy.ServiceProxy | None = None
        self.zone_dns: ZoneDns | None = None
        self._objects_moved = RevisionGate()
        self.address = host.address  # etcd, the controllers and the lab clients' proxy
        self.generation = registry.state(key).generation  # the bootstrap this runner serves
        self.state = "starting"
        self.control_plane: ControlPlane | None = None
        self.apiservers: ClusterApiservers | None = None
        self.kwok: Managed | None = None
        self.pod_processes: list[PodProcess] = []  # the real Flux Operator and Flux controllers, while their pods run
        self.pod_network: PodNetwork | None = None
        self.kubeprisms: KubePrisms | None = None
        self.standins: list = []
        self.kubeconfig_path = self.workdir / "admin.kubeconfig"
        self._api: client.ApiClient | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # a pass now: a machine's kubelet stopped or started
        self.node_sync = NodeSync(registry, key, self.name, wake=self._wake.set)  # the members' Nodes and what follows them
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"ClusterRunner({self.name} at {self.address}, {self.state})"

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> "ClusterRunner":
        self.registry.set_health_probe(self.key, self._probe_starting)
        self._thread = threading.Thread(target=self._run, name=f"lab-cluster-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 120.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def pids(self) -> dict[str, int]:
        """name → pid of every process running now; the apiservers of further control planes are
        named kube-apiserver@<address>."""
        cp = self.control_plane
        procs = [(p.name, p) for p in cp.processes if p.name != "kube-apiserver"] if cp else []
        procs += [("kube-apiserver" if a == self.address else f"kube-apiserver@{a}", s.process)
                  for a, s in list(cp.apiservers.items())] if cp else []
        if self.kwok is not None:
            procs.append((self.kwok.name, self.kwok))
        if self.cert_manager is not None:
            procs += [(p.name, p) for p in self.cert_manager.processes()]
        procs += [(p.name, p.process) for p in self.pod_processes if p.process is not None]
        return {f"{self.name}/{name}": p.pid for name, p in procs if p.running() and p.pid}

    def _run(self) -> None:
        try:
            if self._start_all():
                self.state = "running"
                log.info("cluster %s: control plane for %s (etcd on %s), kwok, stand-ins running",
                         self.name, self.config.endpoint, self.address)
                while not self._stop.is_set():
                    self._wake.wait(self.poll)
                    self._wake.clear()
                    if not self._stop.is_set():
                        self._tick()
        except Exception as e:  # noqa: BLE001 - a runner reports, it never takes the lab down
            self.state = f"failed: {describe(e)}"
            log.exception("cluster %s: runner failed", self.name)
        finally:
            self._teardown()

    def _start_all(self) -> bool:
        for attempt in range(1, START_ATTEMPTS + 1):
            if self._stop.is_set():
                return False
            try:
                self._start_control_plane()
                return True
            except Exception as e:  # noqa: BLE001 - retried, then reported by the probe
                self.state = f"failed: {describe(e)}"
                log.warning("cluster %s: control plane start %d/%d failed: %s", self.name, attempt, START_ATTEMPTS, e)
                self._stop_processes()
                self._stop.wait(5.0)
        return False

    def _start_control_plane(self) -> None:
        # A (re)bootstrapped cluster starts from an empty etcd, or from the snapshot of a recovery.
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        state = self.registry.state(self.key)
        self.apiservers = ClusterApiservers(self.registry, self.key, self.name, self.host, self.config)
        cp = ControlPlane(
            self.name, self.workdir / "controlplane", self.config.pki,
            address=self.address, apiserver_port=self.config.endpoint_port, etcd_ports=(2379, 2380),
            controllers=True, service_cidr=self.config.service_subnet, pod_cidr=self.config.pod_subnet,
            # Always: without it the apiserver would dial a webhook's ClusterIP through the host's
            # default route, off this machine; with it, an unreachable Service is refused here.
            egress_selector=service_proxy.egress_config(service_proxy.socket_path(self.workdir)),
            restore_from=state.recover_from, skip_hash_check=state.skip_hash_check,
            hostname=self.host.hostname, names=self.config.serving_names, clients_via=self.apiservers.start(),
        )
        self.control_plane = cp
        boot_id = self.host.boot_id
        cp.start()
        self.apiservers.attach(cp, boot_id)
        self.registry.set_etcd(self.key, cp.etcd_snapshot)
        self.registry.set_k8s_chain(self.key, cp.pki.ca.crt + cp.pki.accepted_cas)
        fd = os.open(self.kubeconfig_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(cp.lab_kubeconfig())  # kwok and stand-ins: survives a cluster CA rotation
        self._api = api_client(self.kubeconfig_path)
        self.kubeprisms = KubePrisms(self.name, cp.serving)
        self.kubeprisms.reconcile(self.registry.nodes_of(self.key))
        self.pod_network = PodNetwork(self.address, self.config.kube_proxy)
        events = flux_controllers.events_address(self.address)
        self.pod_processes = [
            flux_operator.runner(self.workdir, self.pod_network, address=self.address, cluster=self.name,
                                 events_url=flux_controllers.events_url(events)),
            *flux_controllers.runners(self.workdir, self.pod_network, address=self.address, cluster=self.name,
                                      events=events),
        ]
        self.kwok = kwok.start(self.workdir, self.kubeconfig_path, cluster=self.name,
                               node_ip=self.host.address, pod_cidr=self.config.pod_subnet)
        self.service_proxy = service_proxy.ServiceProxy(service_proxy.socket_path(self.workdir), self.kubeconfig_path,
                                                        cluster=self.name).start()
        if self._real_cert_manager:
            self.cert_manager = CertManager(self.workdir, self.kubeconfig_path, cluster=self.name,
                                            nameservers=[self.acme.nameserver])
            self.zone_dns = ZoneDns(self.acme, cluster=self.name)
        self._tick()  # register the members before anyone asks the probe
        self.registry.set_health_probe(self.key, self.probe)
        if self.with_standins:
            self._start_standins()

    def _start_standins(self) -> None:
        from lab.standins.cert_issuer import CertIssuer
        from lab.standins.gateway import GatewayStandin
        from lab.standins.kontinuum_server import KontinuumServer

        if self.cert_manager is None:  # no ACME server in this lab: nothing real could issue
            self.standins.append(CertIssuer(self.kubeconfig_path, cluster=self.name).start())
        self.standins.append(GatewayStandin(self.kubeconfig_path, cluster=self.name).start())
        if self.hub_kubeconfig is not None:
            # Region and zone come from the zone's kontinuum-env ConfigMap; these are fallbacks only.
            self.standins.append(
                KontinuumServer("lab", self.name, self.kubeconfig_path, Path(self.hub_kubeconfig)).start()
            )

    @property
    def _real_cert_manager(self) -> bool:
        return self.with_standins and self.acme is not None

    def _stop_processes(self) -> None:
        if self.cert_manager is not None:
            self.cert_manager.stop()
        if self.service_proxy is not None:
            self.service_proxy.stop()
            self.service_proxy = None
        if self.zone_dns is not None:
            self.zone_dns.clear()
        for p in self.pod_processes:
            p.stop()
        if self.pod_network is not None:
            self.pod_network.close()
            self.pod_network = None
        if self.kubeprisms is not None:
            self.kubeprisms.stop()
        if self.kwok is not None:
            self.kwok.stop()
            self.kwok = None
        if self.apiservers is not None:
            self.apiservers.stop()
        if self.control_plane is not None:
            self.control_plane.stop()
        if self._api is not None:
            self._api.close()
            self._api = None

    def _teardown(self) -> None:
        failed = self.state.startswith("failed")
        # A cluster whose control plane could not run must not look healthy: its probe says why.
        why = f"the lab could not run the cluster's control plane ({self.state})"
        self.registry.set_health_probe(self.key, (lambda q: [(CHECK_NODES_REPORT, why)]) if failed else None)
        self.node_sync.detach()
        if self.registry.etcd(self.key) == getattr(self.control_plane, "etcd_snapshot", None):
            self.registry.set_etcd(self.key, None)
        for s in self.standins:
            s.stop()
        self.standins.clear()
        self._stop_processes()
        if not failed:
            self.state = "stopped"
        log.info("cluster %s: stopped (%s)", self.name, self.state)

    # -- reconciliation ----------------------------------------------------------------------------

    def _follow_cluster_ca(self) -> None:
        """cluster.ca or cluster.acceptedCAs changed on the hosting control plane (a CA rotation's
        phase, applied without a reboot): restart the control plane on the new chain, as Talos does."""
        if self.control_plane is None:
            return
        configured = self._configured()
        if configured is None or self._serves(configured):
            return
        log.info("cluster %s: the cluster CA chain changed; restarting every apiserver with it", self.name)
        self.control_plane.restart_with(configured.pki)
        self.config = configured
        self.registry.set_k8s_chain(self.key, configured.pki.ca.crt + configured.pki.accepted_cas)

    def ca_settled(self) -> bool:
        """Whether the apiserver serves the CA chain of the host's config: no restart is pending."""
        configured = self._configured()
        return configured is None or self._serves(configured)

    def _configured(self) -> ClusterConfig | None:
        config = self.host.config
        return None if config is None else read_cluster_config(config.raw)

    def _serves(self, configured: ClusterConfig) -> bool:
        # The registry's chain is set only once a restart succeeded, so a failed one is tried again.
        return self.registry.k8s_chain(self.key) == configured.pki.ca.crt + configured.pki.accepted_cas

    def _tick(self) -> None:
        try:
            self._follow_cluster_ca()
        except Exception as e:  # noqa: BLE001 - retried on the next tick
            log.warning("cluster %s: restarting the control plane on the new CA failed, retrying: %s", self.name,
                        describe(e))
        # The passes that follow the cluster's objects only (CNI marks, the pod network, Flux's and
        # cert-manager's processes, the zone's DNS) run when the cluster was written to since the
        # last tick, or a few seconds went by; those that follow the machines run every tick.
        moved = self._api is not None and self._objects_moved.moved(self._api)
        try:
            if self.kwok is not None and not self.kwok.running():
                log.warning("cluster %s: kwok exited; restarting it. Last lines:\n%s", self.name, self.kwok.tail())
                self.kwok = kwok.start(self.workdir, self.kubeconfig_path, cluster=self.name,
                                       node_ip=self.host.address, pod_cidr=self.config.pod_subnet)
            assert self._api is not None
            self.node_sync.reconcile(self._api, self.config, self.pod_processes, objects_moved=moved)
        except Exception as e:  # noqa: BLE001 - retried on the next tick
            log.warning("cluster %s: reconcile failed, retrying: %s", self.name, describe(e))
        try:  # after the kubelets: a rebooting machine's kubelet shuts down before its containers stop
            if self.apiservers is not None:
                self.apiservers.reconcile()
            if self.kubeprisms is not None:
                self.kubeprisms.reconcile(self.registry.nodes_of(self.key))
        except Exception as e:  # noqa: BLE001 - retried on the next tick
            log.warning("cluster %s: following the control planes' apiservers failed, retrying: %s", self.name,
                        describe(e))
        if not moved:
            return
        for part in (self.cert_manager, self.zone_dns):
            if part is None:
                continue
            try:
                part.reconcile(self._api)
            except Exception as e:  # noqa: BLE001 - retried on the next tick
                log.warning("cluster %s: %s reconcile failed, retrying: %s", self.name, type(part).__name__, describe(e))

    # -- health ------------------------------------------------------------------------------------

    def _probe_starting(self, query: HealthQuery) -> list[Check]:
        why = self.state if self.state.startswith("failed") else "the lab is still starting the cluster's kube-apiserver"
        return [(CHECK_NODES_REPORT, why)]

    def probe(self, query: HealthQuery) -> list[Check]:
        """Talos's Kubernetes-level checks, read from the real apiserver (blocking, bounded)."""
        if self._api is None or self.state.startswith(("failed", "stopped")):
            return [(CHECK_NODES_REPORT, f"the cluster's control plane is not running ({self.state})")]
        core = client.CoreV1Api(self._api)
        try:
            nodes = core.list_node(_request_timeout=PROBE_TIMEOUT).items
        except Exception as e:  # noqa: BLE001 - a failed read is the check's reason
            return [(CHECK_NODES_REPORT, describe(e))]
        checks: list[Check] = [(CHECK_NODES_REPORT, nodes_report_problem((*query.control_plane_nodes, *query.worker_nodes), nodes))]
        checks.append((CHECK_CONTROL_PLANE, self._control_plane_problem()))
        checks.append((CHECK_NODES_READY, nodes_ready_problem(nodes)))
        try:
            pods = core.list_namespaced_pod(CNI_NAMESPACE, label_selector=CNI_SELECTOR, _request_timeout=PROBE_TIMEOUT).items
            daemonsets = client.AppsV1Api(self._api).list_namespaced_daemon_set(
                CNI_NAMESPACE, label_selector=CNI_SELECTOR, _request_timeout=PROBE_TIMEOUT).items
            checks.append((CHECK_CILIUM, cilium_problem(pods, daemonsets)))
        except Exception as e:  # noqa: BLE001
            checks.append((CHECK_CILIUM, describe(e)))
        return checks

    def _control_plane_problem(self) -> str | None:
        cp = self.control_plane
        if cp is None:
            return "the control plane is not started"
        down = [p.name for p in cp.processes if not p.running()]
        if down:
            return f"{', '.join(down)} not running"
        try:
            assert self._api is not None
            body = self._api.call_api("/readyz", "GET", response_type="str", auth_settings=["BearerToken"],
                                      _return_http_data_only=True, _request_timeout=PROBE_TIMEOUT)
        except Exception as e:  # noqa: BLE001
            return f"kube-apiserver /readyz: {describe(e)}"
        return None if str(body).strip() == "ok" else f"kube-apiserver /readyz: {str(body).strip()[:200]}"
