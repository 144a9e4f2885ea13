"""The Talos dynamic providers, called directly (no engine) against emulated nodes over real
gRPC and TLS: what each create/update/delete does to the nodes, and how it fails."""

from __future__ import annotations

import http.server
import json
import ssl
import threading
import time
from pathlib import Path

import pytest
from grpclib.const import Status

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import pki, secrets, talosconfig
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec
from kontinuum.talos.pki import CertKey
from kontinuum.talos.transport import load_cert_chain
from kontinuum.talos.waits import WaitTimeout
from lab.controlplane import free_port
from lab.talos_node import Lab
from providers.bootstrap import BootstrapProvider
from providers.cluster_health import ClusterHealthProvider, ClusterNotHealthy
from providers.config_apply import ConfigApplyProvider
from providers.kubeconfig import KubeconfigNotReady, KubeconfigProvider
from providers.node_teardown import NodeNotResetError
from providers.talos_secrets import TalosSecretsProvider

FIXTURE = Path(__file__).parents[1] / "unit" / "fixtures" / "talosctl-secrets.yaml"
REBOOT = 0.2  # seconds an emulated node stays down for a reboot
BOUND = 20.0  # generous bound for waits that are expected to succeed


@pytest.fixture(scope="module")
def lab():
    with Lab(reboot_delay=REBOOT) as lab:
        yield lab


class Cluster:
    """A fresh cluster identity (through TalosSecretsProvider) and fresh maintenance nodes."""

    def __init__(self, lab: Lab, control_planes: int, workers: int = 0, endpoint: str | None = None) -> None:
        self.lab = lab
        self.nodes = lab.add_nodes(control_planes + workers)
        self.addresses = [n.address for n in self.nodes]
        self.roles = {a: "controlplane" if i < control_planes else "worker" for i, a in enumerate(self.addresses)}
        self.control_planes = self.addresses[:control_planes]
        self.workers = self.addresses[control_planes:]
        self.secrets = TalosSecretsProvider().create(
            {"clusterName": "t", "endpoints": self.control_planes}
        ).outs
        self.bundle = secrets.load(self.secrets["secretsYaml"])
        self.spec = {"name": "t", "endpoint": endpoint or f"https://{self.addresses[0]}:6443",
                     "kubernetes_version": "1.35.4", "workers": (PoolSpec("w", workers),) if workers else ()}

    def config(self, role: str = "controlplane", **spec) -> str:
        pool = CONTROLPLANE if role == "controlplane" else "w"
        return mc.render(ClusterSpec(**{**self.spec, **spec}), self.bundle, pool=pool).decode()

    def props(self, address: str, **extra) -> dict:
        role = self.roles[address]
        props = {"address": address, "talosPort": 50000, "role": role, "config": self.config(role),
                 "talosconfig": self.secrets["talosconfig"], "applyTimeout": BOUND, "resetTimeout": BOUND,
                 "resetOnDelete": True, "leaveEtcdOnDelete": role == "controlplane", "skipUnreachable": False}
        return {**props, **extra}

    def apply_all(self) -> dict[str, dict]:
        return {a: ConfigApplyProvider().create(self.props(a)).outs for a in self.addresses}

    def bootstrap(self) -> None:
        BootstrapProvider().create(self.talos(self.addresses[0], timeout=BOUND))

    def talos(self, address: str, **extra) -> dict:
        return {"address": address, "talosPort": 50000, "talosconfig": self.secrets["talosconfig"], **extra}

    @property
    def state(self):
        return self.lab.clusters.state(self.bundle.cluster_id)


# --- TalosSecrets -------------------------------------------------------------------------------


def test_secrets_generated_once_and_endpoints_rerendered_with_the_same_certificate():
    provider = TalosSecretsProvider()
    created = provider.create({"clusterName": "eu-a", "endpoints": ["127.0.21.1"]})
    first = talosconfig.parse(created.outs["talosconfig"])
    bundle = secrets.load(created.outs["secretsYaml"])
    pki.load_certificate(first.crt).verify_directly_issued_by(pki.load_certificate(bundle.os.crt))

    news = {"clusterName": "eu-a", "endpoints": ["127.0.21.1", "127.0.21.2"]}
    assert provider.diff("eu-a", created.outs, news).replaces == []
    updated = provider.update("eu-a", created.outs, news).outs
    second = talosconfig.parse(updated["talosconfig"])
    assert second.endpoints == ["127.0.21.1", "127.0.21.2"]
    assert (second.crt, second.key, second.ca) == (first.crt, first.key, first.ca)  # not re-issued
    assert updated["secretsYaml"] == created.outs["secretsYaml"]


def test_secrets_import_keeps_the_operators_bundle_byte_for_byte():
    text = FIXTURE.read_text()
    outs = TalosSecretsProvider().create({"clusterName": "eu-a", "endpoints": ["127.0.21.1"], "importYaml": text}).outs
    assert outs["secretsYaml"] == text
    assert talosconfig.parse(outs["talosconfig"]).ca == secrets.load(text).os.crt


def test_secrets_reject_a_changed_import_on_an_existing_resource():
    provider = TalosSecretsProvider()
    olds = {"clusterName": "eu-a", "endpoints": ["127.0.21.1"], "importYaml": FIXTURE.read_text()}
    other = secrets.dump(secrets.generate())
    failures = provider.check(olds, {**olds, "importYaml": other}).failures
    assert [f.property for f in failures] == ["importYaml"]
    assert "never rotated" in failures[0].reason and "BEGIN" not in failures[0].reason
    assert provider.check(olds, {**olds, "importYaml": None}).failures  # removing it is a change too
    assert not provider.check(olds, dict(olds)).failures


# --- ConfigApply ----------------------------------------------------------------------------------


def test_apply_in_maintenance_then_reapply_a_change_over_mtls_to_exactly_that_node(lab):
    cluster = Cluster(lab, 2)
    a, b = cluster.nodes
    outs = cluster.apply_all()
    assert {n.mode for n in cluster.nodes} == {"configured"}
    assert outs[a.address]["configHash"] and "config" not in outs[a.address]
    for node in cluster.nodes:
        node.reset_calls()

    changed = cluster.props(a.address, config=cluster.config(cert_sans=("kube.example.test",)))
    provider = ConfigApplyProvider()
    diff = provider.diff(a.address, outs[a.address], changed)
    assert diff.changes and diff.replaces == []
    updated = provider.update(a.address, outs[a.address], changed).outs

    assert updated["configHash"] != outs[a.address]["configHash"]
    assert a.calls.get("ApplyConfiguration") == 1 and "ApplyConfiguration" not in b.calls
    assert "kube.example.test" in a.config.cert_sans and a.mode == "configured"


def test_create_on_an_already_configured_node_reapplies_over_mtls(lab, caplog):
    cluster = Cluster(lab, 1)
    (node,) = cluster.nodes
    cluster.apply_all()
    node.reset_calls()
    caplog.set_level("INFO", logger="kontinuum.providers.talos")

    outs = ConfigApplyProvider().create(cluster.props(node.address)).outs  # a re-run after a crash

    assert outs["address"] == node.address and node.mode == "configured"
    assert node.calls.get("ApplyConfiguration") == 1  # the maintenance try never got past TLS
    assert "maintenance-mode apply refused" in caplog.text and "over mTLS" in caplog.text


def test_a_change_the_node_applies_with_a_reboot_is_waited_out(lab):
    cluster = Cluster(lab, 1, workers=1)
    cp = cluster.nodes[0]
    ConfigApplyProvider().create(cluster.props(cp.address))
    cp.reset_calls()
    as_worker = cluster.props(cp.address, role="worker", config=cluster.config("worker"))

    ConfigApplyProvider().create(as_worker)  # auto mode: a new machine type needs a reboot

    assert cp.calls.get("ApplyConfiguration") == 1
    assert cp.mode == "configured" and not cp.is_control_plane  # returned only once back from the reboot


def test_delete_leaves_etcd_and_resets_to_maintenance(lab):
    cluster = Cluster(lab, 2, workers=1)
    cluster.apply_all()
    cluster.bootstrap()
    _, b, w = cluster.nodes
    assert len(cluster.state.members) == 2

    ConfigApplyProvider().delete(w.address, cluster.props(w.address))
    assert w.mode == "maintenance" and w.calls.get("Reset") == 1 and "EtcdLeaveCluster" not in w.calls

    ConfigApplyProvider().delete(b.address, cluster.props(b.address))

    assert b.mode == "maintenance" and b.calls.get("EtcdLeaveCluster") == 1 and b.calls.get("Reset") == 1
    assert [m.address for m in cluster.state.members.values()] == [cluster.addresses[0]]
    b.reset_calls()
    ConfigApplyProvider().delete(b.address, cluster.props(b.address))  # again: already done
    assert "Reset" not in b.calls


def test_delete_of_a_never_bootstrapped_control_plane_resets_it(lab):
    cluster = Cluster(lab, 1)
    cluster.apply_all()
    (node,) = cluster.nodes
    ConfigApplyProvider().delete(node.address, cluster.props(node.address))
    assert node.mode == "maintenance" and node.calls.get("Reset") == 1


def test_control_plane_delete_fails_closed_when_leaving_etcd_fails(lab):
    cluster = Cluster(lab, 2)
    cluster.apply_all()
    cluster.bootstrap()
    a = cluster.nodes[0]
    a.reset_calls()
    # The first failure hits the quorum gate's member list (unreadable: no gate), the second the leave.
    a.fail_next(2, Status.INTERNAL, "etcdserver: request timed out")

    with pytest.raises(NodeNotResetError) as err:  # (no drain: the injected failure is for leaving etcd)
        ConfigApplyProvider().delete(a.address, cluster.props(a.address, drain=False))

    assert a.calls.get("EtcdLeaveCluster") == 1 and "Reset" not in a.calls
    assert a.mode == "configured" and a.address in {m.address for m in cluster.state.members.values()}
    message = str(err.value)
    assert a.address in message and "request timed out" in message and "leaveEtcdOnDelete" in message


def test_unreachable_node_fails_within_its_bound_or_is_skipped(lab):
    cluster = Cluster(lab, 1)
    cluster.apply_all()
    (node,) = cluster.nodes
    node.set_faults(refuse=True)
    try:
        props = cluster.props(node.address, resetTimeout=1.0)
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as err:
            ConfigApplyProvider().delete(node.address, props)
        assert time.monotonic() - started < 5
        assert node.address in str(err.value) and "`lost: true`" in str(err.value)  # the way to declare it dead

        started = time.monotonic()
        ConfigApplyProvider().delete(node.address, {**props, "skipUnreachable": True})
        assert time.monotonic() - started < 5
    finally:
        node.set_faults(refuse=False)
    assert node.mode == "configured"  # nothing reached it


# --- Bootstrap, Kubeconfig, ClusterHealth --------------------------------------------------------


def test_bootstrap_twice_has_one_effect_and_no_error(lab):
    cluster = Cluster(lab, 1)
    cluster.apply_all()
    (node,) = cluster.nodes
    props = cluster.talos(node.address, timeout=BOUND)
    first = BootstrapProvider().create(props)
    members = dict(cluster.state.members)
    second = BootstrapProvider().create(props)

    assert first.outs["bootstrapped"] is True and second.outs["bootstrapped"] is True
    assert node.calls.get("Bootstrap") == 2 and cluster.state.members == members and len(members) == 1


def test_kubeconfig_names_the_condition_that_never_held(lab):
    cluster = Cluster(lab, 1, endpoint=f"https://127.0.0.1:{free_port()}")  # nothing listens there
    cluster.apply_all()
    address = cluster.addresses[0]
    props = cluster.talos(address, timeout=1.5, requestTimeout=0.5)

    started = time.monotonic()
    with pytest.raises(KubeconfigNotReady, match="Kubeconfig RPC on .* never succeeded"):
        KubeconfigProvider().create(props)  # not bootstrapped: no kubeconfig yet
    cluster.bootstrap()
    with pytest.raises(KubeconfigNotReady) as err:
        KubeconfigProvider().create(props)
    assert time.monotonic() - started < 8
    message = str(err.value)
    assert "RPC succeeded, but the apiserver at https://127.0.0.1:" in message and "never answered" in message
    assert "BEGIN" not in message and "client-key" not in message


def test_kubeconfig_output_once_the_apiserver_answers_with_its_credentials(lab, tmp_path):
    port = free_port()
    cluster = Cluster(lab, 1, endpoint=f"https://127.0.0.1:{port}")
    with _VersionServer(cluster.bundle.k8s, port):
        cluster.apply_all()
        cluster.bootstrap()
        outs = KubeconfigProvider().create(cluster.talos(cluster.addresses[0], timeout=BOUND, requestTimeout=2.0)).outs
    assert outs["endpoint"] == f"https://127.0.0.1:{port}" and outs["kubernetesVersion"] == "v1.35.4"
    assert "client-certificate-data" in outs["kubeconfig"]


def test_cluster_health_passes_and_fails_with_the_last_progress_line(lab):
    cluster = Cluster(lab, 1, workers=1)
    cluster.apply_all()
    cluster.bootstrap()
    props = cluster.talos(cluster.addresses[0], controlPlaneNodes=cluster.control_planes,
                          workerNodes=cluster.workers, timeout=BOUND)

    outs = ClusterHealthProvider().create(props).outs
    assert outs["healthy"] is True and outs["checkedNodes"] == cluster.addresses

    lab.set_health_probe(cluster.bundle.cluster_id, lambda q: [("kubelet to be ready", "node t-1 is NotReady")])
    started = time.monotonic()
    with pytest.raises(ClusterNotHealthy) as err:
        ClusterHealthProvider().create({**props, "timeout": 1.0})
    assert time.monotonic() - started < 1.0 + 5
    assert "last progress: waiting for kubelet to be ready: node t-1 is NotReady" in str(err.value)


def test_cluster_health_checks_the_workers_that_have_joined(lab):
    """The zone's listed workers go into the check only once they run this cluster's config: the
    gate before workers join passes, and a re-run after they joined includes them."""
    cluster = Cluster(lab, 1, workers=1)
    cp, worker = cluster.addresses
    ConfigApplyProvider().create(cluster.props(cp))
    cluster.bootstrap()
    props = cluster.talos(cp, controlPlaneNodes=[cp], workerNodes=[worker], timeout=BOUND)
    assert ClusterHealthProvider().create(props).outs["checkedNodes"] == [cp]
    ConfigApplyProvider().create(cluster.props(worker))
    assert ClusterHealthProvider().update(cp, props, props).outs["checkedNodes"] == [cp, worker]


class _VersionServer:
    """Stands in for a kube-apiserver: GET /version over TLS from the cluster's Kubernetes CA,
    only for clients with a certificate from that CA."""

    BODY = {"major": "1", "minor": "35", "gitVersion": "v1.35.4", "gitCommit": "0", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64"}

    def __init__(self, k8s_ca: CertKey, port: int) -> None:
        leaf = pki.issue_cert(k8s_ca, common_name="kube-apiserver", ip_addresses=["127.0.0.1"], server=True,
                              key_type="ecdsa")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        load_cert_chain(ctx, leaf.crt, leaf.key)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=k8s_ca.crt.decode())
        body = json.dumps(self.BODY).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200 if self.path.rstrip("/") == "/version" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
