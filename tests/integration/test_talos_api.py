"""Our Talos client against the Talos node emulator, over real sockets, TLS and gRPC.

Every client operation runs in both modes it applies to; the emulator's lifecycle (maintenance →
configured → reset), its roles and its fault knobs are exercised through the client, so each
test checks both sides. Nodes come from the emulator's own address pool (127.0.21.0/24), one
Lab per test, and stop with it.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from grpclib.const import Status

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import pki, secrets, talosconfig
from kontinuum.talos.client import Deadlines, TalosClient, discover
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec
from kontinuum.talos.errors import (
    AlreadyBootstrappedError,
    ClientCertificateRejectedError,
    ClusterUnhealthyError,
    InvalidMachineConfigError,
    NodeUnreachableError,
    NotInMaintenanceError,
    PermissionDeniedError,
    TalosApiError,
    TalosTimeoutError,
    TlsTrustError,
    WrongModeError,
)
from lab.talos_node import EmulatedNode, Lab

ROOT = Path(__file__).resolve().parents[2]
REBOOT = 0.1  # emulated reboot delay: long enough to be observable, short enough to be cheap
UP = 10.0  # bound for a node to come back from a reboot
STATE_WIPE = ("STATE", "EPHEMERAL")  # Talos's documented way back to maintenance mode


@pytest.fixture(scope="module")
def bundle() -> secrets.SecretsBundle:
    return secrets.generate()  # RSA-4096 service-account key: generate once per module


@pytest.fixture
def lab():
    with Lab(reboot_delay=REBOOT) as lab:
        yield lab


@dataclass
class Cluster:
    """A cluster's secrets and endpoint, and clients for its nodes."""

    bundle: secrets.SecretsBundle
    endpoint_address: str
    workers: int = 0

    @property
    def spec(self) -> ClusterSpec:
        workers = (PoolSpec("general", self.workers),) if self.workers else ()
        return ClusterSpec(
            name="emulated",
            endpoint=f"https://{self.endpoint_address}:6443",
            kubernetes_version="1.34.1",
            workers=workers,
        )

    def config(self, pool: str = CONTROLPLANE) -> bytes:
        return mc.render(self.spec, self.bundle, pool=pool)

    def client(self, node: str, *, role: str = "os:admin", endpoint: str | None = None, **kw) -> TalosClient:
        cert = talosconfig.issue_client_cert(self.bundle.os, role=role)
        return self.client_with(cert, node, endpoint=endpoint, **kw)

    def client_with(self, cert: pki.CertKey, node: str, *, endpoint: str | None = None, ca: bytes | None = None, **kw):
        text = talosconfig.render("emulated", [endpoint or node], [node], ca or self.bundle.os.crt, cert)
        return TalosClient.from_talosconfig(talosconfig.parse(text), **kw)


def configure(node: EmulatedNode, config: bytes) -> None:
    TalosClient.maintenance(node.address).apply_config(config)
    node.wait_for("configured", UP)


@pytest.fixture
def cp(lab, bundle):
    """One configured control-plane node and its cluster."""
    node = lab.add_node()
    cluster = Cluster(bundle, node.address)
    configure(node, cluster.config())
    return node, cluster


def within(seconds: float):
    """Context manager asserting the block finishes within `seconds`."""

    class Timer:
        def __enter__(self):
            self.start = time.monotonic()
            return self

        def __exit__(self, *exc):
            self.elapsed = time.monotonic() - self.start
            assert self.elapsed <= seconds, f"took {self.elapsed:.2f} s, bound {seconds} s"
            return False

    return Timer()


# --- maintenance mode ----------------------------------------------------------------------


def test_discover_reads_version_links_and_addresses(lab):
    node = lab.add_node()
    found = discover(node.address)
    assert found.talos_version == "v1.13.0"
    assert found.fingerprint == node.fingerprint
    eth0 = next(link for link in found.links if link.name == "eth0")
    assert eth0.kind == "ether" and eth0.state == "up" and eth0.mac.startswith("02:00:")
    assert any(a.cidr == f"{node.address}/8" and a.scope == "global" and a.link == "eth0" for a in found.addresses)
    assert node.calls == {"Get": 1, "List": 2}


def test_maintenance_refuses_version_and_configured_only_calls(lab):
    node = lab.add_node()
    client = TalosClient.maintenance(node.address)
    with pytest.raises(WrongModeError, match="API is not implemented in maintenance mode"):
        client.version()
    with pytest.raises(WrongModeError, match="method Bootstrap not implemented"):
        client.bootstrap()
    with pytest.raises(WrongModeError, match="unknown service cluster.ClusterService"):
        client.health_check([node.address], wait_timeout=1)
    with pytest.raises(WrongModeError) as err:
        client.reset()
    assert node.address in str(err.value) and "reset" in str(err.value)


def test_maintenance_apply_validates_config(lab, bundle):
    node = lab.add_node()
    client = TalosClient.maintenance(node.address)
    good = Cluster(bundle, node.address).config()
    with pytest.raises(WrongModeError, match="--mode='no-reboot' is not supported in maintenance mode"):
        client.apply_config(good, mode="no-reboot")
    with pytest.raises(WrongModeError, match="--mode='staged'"):
        client.apply_config(good, mode="staged")
    broken = yaml.safe_load(good)
    del broken["cluster"]["controlPlane"]
    broken["machine"]["type"] = "boss"
    with pytest.raises(InvalidMachineConfigError) as err:
        client.apply_config(yaml.safe_dump(broken))
    assert "cluster controlplane endpoint is required" in err.value.problem
    assert 'unknown machine type: "boss"' in err.value.problem
    with pytest.raises(InvalidMachineConfigError, match="v1alpha1"):
        client.apply_config(b"apiVersion: v1alpha1\nkind: SideroLinkConfig\n")
    assert client.apply_config(good, dry_run=True).details.startswith("Dry run summary")
    assert node.mode == "maintenance"


def test_apply_in_maintenance_reboots_into_configured_mode(lab, bundle):
    node = lab.add_node()
    client = TalosClient.maintenance(node.address)
    result = client.apply_config(Cluster(bundle, node.address).config())
    assert result.mode == "reboot"
    node.wait_for("configured", UP)
    # The same maintenance client now meets a node that wants client certificates.
    with pytest.raises(NotInMaintenanceError) as err:
        client.discover()
    assert "discover on " + node.address in str(err.value)
    with pytest.raises(NotInMaintenanceError):
        TalosClient.maintenance(node.address).apply_config(b"version: v1alpha1\n")


def test_maintenance_certificate_is_pinned(lab):
    node = lab.add_node()
    client = TalosClient.maintenance(node.address)
    pinned = client.discover().fingerprint
    node.reboot()  # a new boot, a new ephemeral maintenance identity
    assert node.fingerprint != pinned
    with pytest.raises(TlsTrustError, match="certificate changed since first contact"):
        client.apply_config(b"version: v1alpha1\n")
    assert "ApplyConfiguration" not in node.calls  # nothing was sent to the new identity
    assert TalosClient.maintenance(node.address, fingerprint=node.fingerprint).discover().talos_version


# --- configured mode -----------------------------------------------------------------------


def test_configured_node_lifecycle(lab, cp):
    node, cluster = cp
    admin = cluster.client(node.address)
    version = admin.version()
    assert (version.tag, version.platform, version.rbac) == ("v1.13.0", "metal", True)
    with pytest.raises(TalosApiError, match="not available before the cluster is bootstrapped"):
        admin.kubeconfig()
    services = {s.id: s for s in admin.service_list()}
    assert services["apid"].healthy and services["etcd"].state == "Preparing"

    admin.bootstrap()
    with pytest.raises(AlreadyBootstrappedError, match="etcd data directory is not empty"):
        admin.bootstrap()
    assert {s.id: s.state for s in admin.service_list()}["etcd"] == "Running"
    [member] = admin.etcd_members()
    assert member.hostname == node.hostname and member.peer_urls == (f"https://{node.address}:2380",)

    kubeconfig = yaml.safe_load(admin.kubeconfig())
    assert kubeconfig["current-context"] == "admin@emulated"
    assert kubeconfig["clusters"][0]["cluster"]["server"] == cluster.spec.endpoint
    user = x509.load_pem_x509_certificate(base64.b64decode(kubeconfig["users"][0]["user"]["client-certificate-data"]))
    assert user.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "admin"
    assert user.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    assert user.issuer == x509.load_pem_x509_certificate(cluster.bundle.k8s.crt).subject

    progress: list[str] = []
    assert admin.health_check([node.address], wait_timeout=5, on_progress=progress.append)[-1].endswith(": OK")
    assert progress[0].startswith("discovered nodes") and "waiting for etcd to be healthy: OK" in progress

    again = admin.apply_config(cluster.config())
    assert again.mode == "no-reboot" and node.mode == "configured"
    assert admin.apply_config(cluster.config(), mode="staged").mode == "staged"
    boots = node.boots
    assert admin.apply_config(cluster.config(), mode="reboot").details == "Applied configuration with a reboot"
    node.wait_for("configured", UP, after_boot=boots)
    assert [m.hostname for m in admin.etcd_members()] == [node.hostname]  # still its cluster's member
    with pytest.raises(InvalidMachineConfigError):
        admin.apply_config(b"version: v1alpha1\nmachine: {}\n")

    boots = node.boots
    assert admin.upgrade("ghcr.io/siderolabs/installer:v1.13.2") == "Upgrade request received"
    node.wait_for("configured", UP, after_boot=boots)
    assert admin.version().tag == "v1.13.2"
    with pytest.raises(TalosApiError, match="no Talos version tag"):
        admin.upgrade("ghcr.io/siderolabs/installer")

    key = node.cluster_key
    assert admin.reset(graceful=True, reboot=True, system_partitions=STATE_WIPE)
    node.wait_for("maintenance", UP)
    assert discover(node.address).talos_version == "v1.13.2"
    assert not lab.clusters.state(key).bootstrapped  # the only node left: the cluster is gone
    assert node.calls["Bootstrap"] == 2 and node.calls["Reset"] == 1


def test_control_planes_share_etcd_and_route_through_an_endpoint(lab, bundle):
    cp1, cp2, worker = lab.add_nodes(3)
    cluster = Cluster(bundle, cp1.address, workers=1)
    configure(cp1, cluster.config())
    configure(cp2, cluster.config())
    configure(worker, cluster.config("general"))

    via_cp1 = cluster.client(cp2.address, endpoint=cp1.address)  # `node` metadata: proxied by cp1
    via_cp1.bootstrap()
    assert cp2.calls["Bootstrap"] == 1 and cp1.calls["Bootstrap"] == 1
    members = cluster.client(cp1.address).etcd_members()
    assert sorted(m.hostname for m in members) == sorted([cp1.hostname, cp2.hostname])
    with pytest.raises(AlreadyBootstrappedError):
        cluster.client(cp1.address).bootstrap()

    wk = cluster.client(worker.address)
    with pytest.raises(TalosApiError, match="bootstrap can only be performed on a control plane node") as err:
        wk.bootstrap()
    assert err.value.status is Status.FAILED_PRECONDITION
    with pytest.raises(WrongModeError, match="only available on control plane nodes"):
        wk.kubeconfig()
    assert cluster.client(cp1.address).health_check([cp1.address, cp2.address], [worker.address], wait_timeout=5)

    cluster.client(cp2.address).etcd_leave()
    assert [m.hostname for m in cluster.client(cp1.address).etcd_members()] == [cp1.hostname]
    with pytest.raises(ClusterUnhealthyError, match="etcd members") as err:
        cluster.client(cp1.address).health_check([cp1.address, cp2.address], wait_timeout=0.6)
    assert "last progress: waiting for etcd members to be control plane nodes" in str(err.value)

    cluster.client(cp2.address).reset(graceful=False, system_partitions=STATE_WIPE)  # leaves its member behind
    cp2.wait_for("maintenance", UP)
    configure(cp2, cluster.config())  # rejoins the bootstrapped etcd on boot
    stale = {m.hostname: m.id for m in cluster.client(cp1.address).etcd_members()}[cp2.hostname]
    cluster.client(cp1.address).etcd_remove_member(stale)
    with pytest.raises(TalosApiError, match="member not found") as err:
        cluster.client(cp1.address).etcd_remove_member(stale)
    assert err.value.status is Status.NOT_FOUND


def test_health_probe_hook_gates_the_health_check(lab, cp):
    node, cluster = cp
    admin = cluster.client(node.address)
    admin.bootstrap()
    ready = threading.Event()
    lab.set_health_probe(
        node.cluster_key, lambda q: [("kube-apiserver to be ready", None if ready.is_set() else f"{q.control_plane_nodes[0]}: not yet")]
    )
    with pytest.raises(ClusterUnhealthyError, match="kube-apiserver to be ready"):
        admin.health_check([node.address], wait_timeout=0.5)
    # The probe passes once the client has seen it fail: deterministic however slow the machine.
    seen = admin.health_check(
        [node.address], wait_timeout=5, on_progress=lambda m: ready.set() if m.endswith("not yet") else None
    )
    assert seen[-2:] == [f"waiting for kube-apiserver to be ready: {node.address}: not yet", "waiting for kube-apiserver to be ready: OK"]


def test_whole_disk_reset_comes_back_only_by_netboot(lab, cp):
    """A wiped system disk has nothing to boot: like real hardware, the machine stays off the
    network unless it boots from the network, which brings it back in maintenance mode."""
    node, cluster = cp
    cluster.client(node.address).reset(graceful=False)  # no partitions named: the whole disk
    node.wait_for("off", UP)
    with pytest.raises(NodeUnreachableError):
        discover(node.address)
    node.set_faults(netboot=True)
    node.power_on()
    node.wait_for("maintenance", UP)
    configure(node, cluster.config())
    cluster.client(node.address).reset(graceful=False)
    node.wait_for("maintenance", UP)  # netboot: back in maintenance after the whole-disk wipe


def test_ephemeral_only_reset_keeps_the_config(lab, cp):
    node, cluster = cp
    cluster.client(node.address).reset(graceful=False, system_partitions=("EPHEMERAL",))
    node.wait_for("configured", UP, after_boot=node.boots)
    assert node.config is not None


def test_reset_without_reboot_powers_off(lab, cp):
    node, cluster = cp
    cluster.client(node.address).reset(reboot=False)
    node.wait_for("off", UP)
    with pytest.raises(NodeUnreachableError):
        discover(node.address)
    node.power_on()
    assert discover(node.address).talos_version


# --- authorization -------------------------------------------------------------------------


def test_configured_node_authorizes_by_certificate(lab, cp):
    node, cluster = cp
    with pytest.raises(NotInMaintenanceError):  # no client certificate at all
        TalosClient.maintenance(node.address).discover()

    reader = cluster.client(node.address, role="os:reader")
    assert reader.version().tag and reader.service_list()
    with pytest.raises(PermissionDeniedError, match="not authorized"):
        reader.apply_config(cluster.config())
    with pytest.raises(PermissionDeniedError, match="not authorized"):
        reader.bootstrap()

    both_usages = pki.issue_cert(cluster.bundle.os, organizations=["os:admin"], client=True, server=True)
    with pytest.raises(PermissionDeniedError):  # ExtKeyUsage must be exactly ClientAuth
        cluster.client_with(both_usages, node.address).version()

    foreign = talosconfig.issue_client_cert(pki.new_ca(organizations=["talos"], key_type="ed25519"))
    with pytest.raises(ClientCertificateRejectedError):
        cluster.client_with(foreign, node.address).version()
    with pytest.raises(TlsTrustError, match="certificate verification failed"):
        cluster.client(node.address, ca=pki.new_ca(organizations=["talos"], key_type="ed25519").crt).version()

    admin = cluster.client(node.address)
    admin.apply_config(cluster.config())
    admin.bootstrap()


# --- deadlines and faults ------------------------------------------------------------------

SHORT = Deadlines(**{name: 0.4 for name in Deadlines.__dataclass_fields__})
SLACK = 1.0


def test_every_operation_honours_its_deadline_when_the_node_hangs(lab, bundle):
    maintenance = lab.add_node()
    configured = lab.add_node()
    cluster = Cluster(bundle, configured.address)
    configure(configured, cluster.config())
    maintenance.set_faults(hang=True)
    configured.set_faults(hang=True)

    insecure = TalosClient.maintenance(maintenance.address, deadlines=SHORT)
    admin = cluster.client(configured.address, deadlines=SHORT)
    operations = {
        "discover": insecure.discover,
        "apply-config (maintenance)": lambda: insecure.apply_config(cluster.config()),
        "apply-config": lambda: admin.apply_config(cluster.config()),
        "bootstrap": admin.bootstrap,
        "kubeconfig": admin.kubeconfig,
        "health-check": lambda: admin.health_check([configured.address], wait_timeout=0.4),
        "reset": admin.reset,
        "etcd-members": admin.etcd_members,
        "etcd-leave": admin.etcd_leave,
        "etcd-remove-member": lambda: admin.etcd_remove_member(1),
        "upgrade": lambda: admin.upgrade("ghcr.io/siderolabs/installer:v1.13.2"),
        "service-list": admin.service_list,
        "version": admin.version,
    }
    for name, operation in operations.items():
        with within(0.8 + SLACK), pytest.raises(TalosTimeoutError, match="no answer within") as err:
            operation()
        assert err.value.node in (maintenance.address, configured.address), name
    with within(0.3 + SLACK), pytest.raises(TalosTimeoutError, match="within 0.3 s"):
        admin.version(timeout=0.3)  # per-call override
    assert configured.mode == "configured"  # nothing hung got through


def test_fault_knobs(lab, cp):
    node, cluster = cp
    admin = cluster.client(node.address, deadlines=SHORT)

    node.set_faults(refuse=True)
    with within(SLACK), pytest.raises(NodeUnreachableError, match="cannot connect"):
        admin.version()
    node.set_faults(refuse=False)
    assert admin.version().tag

    node.fail_next(2, Status.UNAVAILABLE, "node is shutting down")
    with pytest.raises(NodeUnreachableError, match="node is shutting down"):
        admin.version()
    with pytest.raises(NodeUnreachableError):
        admin.service_list()
    assert admin.version().tag  # the third call goes through

    node.set_faults(latency=0.25)
    started = time.monotonic()
    admin.version()
    assert time.monotonic() - started >= 0.25
    with pytest.raises(TalosTimeoutError):
        admin.version(timeout=0.1)
    node.clear_faults()

    node.reset_calls()
    admin.version()
    admin.service_list()
    assert node.calls == {"Version": 1, "ServiceList": 1}

    node.set_faults(reboot_delay=1.0)
    admin.reset(system_partitions=STATE_WIPE)
    node.wait_for("rebooting", UP)  # down for reboot_delay, then back in maintenance
    with pytest.raises(NodeUnreachableError):
        admin.version()
    node.wait_for("maintenance", UP)


def test_client_is_safe_to_share_between_threads(lab, cp):
    node, cluster = cp
    admin = cluster.client(node.address)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(admin.version().tag)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == ["v1.13.0"] * 6


def test_standalone_emulator_process_and_control_endpoint(lab):
    import json
    import urllib.request

    address = lab.free_address()  # served by a separate process, not by this lab
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab.talos_node", "--address", address, "--reboot-delay", "0.1", "--ttl", "60"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert "control http://" in proc.stdout.readline()
        assert discover(address).talos_version == "v1.13.0"

        def post(path: str, body: dict) -> dict:
            request = urllib.request.Request(f"http://{address}:50080{path}", data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(request, timeout=5) as reply:
                return json.load(reply)

        state = post("/faults", {"refuse": True})
        assert state["faults"]["refuse"] and state["calls"] == {"Get": 1, "List": 2}
        with pytest.raises(NodeUnreachableError):
            discover(address)
        post("/faults", {"refuse": False, "fail_next": {"count": 1, "status": "permission_denied"}})
        with pytest.raises(PermissionDeniedError, match="injected failure"):
            discover(address)
    finally:
        proc.terminate()
        proc.wait(10)


def test_emulator_binds_loopback_only():
    with pytest.raises(ValueError, match="127.0.0.0/8"):
        Lab(pool="192.0.2.0/24")
    out = subprocess.run(
        [sys.executable, "-m", "lab.talos_node", "--address", "192.0.2.10"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert out.returncode == 2 and "loopback addresses only" in out.stderr


def test_a_method_the_emulator_does_not_serve_answers_grpc_unimplemented(lab):
    """As a real node's grpc-go server does: a proper gRPC status, never a reply a Go client
    calls malformed (missing content-type)."""
    from google.protobuf import empty_pb2
    from grpclib.const import Cardinality

    node = lab.add_node()

    async def body(channel, md, t):
        async with channel.request("/machine.MachineService/Containers", Cardinality.UNARY_UNARY, empty_pb2.Empty,
                                   empty_pb2.Empty, timeout=t, metadata=md) as stream:
            await stream.send_message(empty_pb2.Empty(), end=True)
            await stream.recv_message()

    with pytest.raises(WrongModeError, match="unknown method Containers for service machine.MachineService"):
        TalosClient.maintenance(node.address)._run("containers", 5.0, body)
