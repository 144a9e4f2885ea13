"""An emulated machine crashes and powers on again (DESIGN §11), seen over real sockets, TLS and
gRPC through our Talos client and the node's HTTP control endpoint: it times out (never refuses)
while down, its etcd member stays listed and is named unreachable through the others, and it comes
back with its config; a member removed while it was down leaves its etcd failing until a reset.
Addresses 127.0.52.0/29 are this module's own. (The kubelet side, a Node going Unknown, is in
test_lab_clusters.py, which runs a real control plane.)
"""

from __future__ import annotations

import socket
import ssl
import time

import pytest

from kontinuum.lifecycle import etcd_health
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec
from kontinuum.talos.errors import ClusterUnhealthyError, TalosTimeoutError
from lab.talos_node import Lab, control

DEADLINE = 2.0  # seconds our client gives a call to a crashed node
UP = 10.0  # bound for a node to boot
CONTROL_PORT = 50081


@pytest.fixture(scope="module")
def bundle() -> secrets.SecretsBundle:
    return secrets.generate()


@pytest.fixture(scope="module")
def cluster(bundle):
    """Three control planes and a worker, bootstrapped; cp3 and the worker serve their control endpoint."""
    with Lab(pool="127.0.52.0/29", reboot_delay=0.1) as lab:
        cps, worker = lab.add_nodes(3), lab.add_node()
        spec = ClusterSpec(name="crash", endpoint=f"https://{cps[0].address}:6443", kubernetes_version="1.34.1",
                           control_plane=PoolSpec(CONTROLPLANE, 3), workers=(PoolSpec("general", 1),))
        for node in cps:
            TalosClient.maintenance(node.address).apply_config(mc.render(spec, bundle))
        TalosClient.maintenance(worker.address).apply_config(mc.render(spec, bundle, pool="general"))
        for node in (*cps, worker):
            node.wait_for("configured", UP)
        servers = [control.serve(n, CONTROL_PORT) for n in (cps[2], worker)]
        talos(bundle, cps[0].address).bootstrap()
        try:
            yield lab, cps, worker
        finally:
            for server in servers:
                server.shutdown()
                server.server_close()


def talos(bundle, node: str, endpoint: str | None = None) -> TalosClient:
    cert = talosconfig.issue_client_cert(bundle.os)
    text = talosconfig.render("crash", [endpoint or node], [node], bundle.os.crt, cert)
    return TalosClient.from_talosconfig(talosconfig.parse(text))


def members(bundle, via: str) -> dict[str, int]:
    return {m.hostname: m.id for m in talos(bundle, via).etcd_members()}


def etcd_service(bundle, node: str):
    (etcd,) = [s for s in talos(bundle, node).service_list() if s.id == "etcd"]
    return etcd


def health_problem(bundle, via: str, cps, workers=()) -> str:
    with pytest.raises(ClusterUnhealthyError) as failed:
        talos(bundle, via).health_check([n.address for n in cps], [n.address for n in workers], wait_timeout=1)
    return str(failed.value)


def assert_times_out(call) -> None:
    start = time.monotonic()
    with pytest.raises(TalosTimeoutError):
        call()
    elapsed = time.monotonic() - start
    assert DEADLINE - 0.5 <= elapsed <= DEADLINE + 2, f"gave up after {elapsed:.1f} s, deadline {DEADLINE} s"


def assert_dead_host(address: str) -> None:
    """The port is not refused; TLS gets no answer."""
    with socket.create_connection((address, 50000), timeout=1) as raw:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        raw.settimeout(1)
        with pytest.raises((TimeoutError, socket.timeout)):
            context.wrap_socket(raw)


def test_a_crashed_control_plane_times_out_stays_a_member_and_comes_back(bundle, cluster):
    lab, (cp1, cp2, cp3), worker = cluster
    before = control.read_state(cp3.address, port=CONTROL_PORT)
    ids = members(bundle, cp1.address)

    state = control.crash(cp3.address, port=CONTROL_PORT)
    assert state["mode"] == "crashed" and state["events"][-1]["event"] == "crashed"
    assert_dead_host(cp3.address)
    assert_times_out(lambda: talos(bundle, cp3.address).version(timeout=DEADLINE))
    assert_times_out(lambda: talos(bundle, cp3.address, endpoint=cp1.address).version(timeout=DEADLINE))  # via apid's proxy

    assert members(bundle, cp2.address) == ids  # etcd does not know it died
    problem = health_problem(bundle, cp1.address, [cp1, cp2, cp3])
    assert "etcd to be healthy" in problem and f"{cp3.address}: rpc error: code = Unavailable" in problem
    assert f"dial tcp {cp3.address}:50000: i/o timeout" in problem
    clients = {n.address: talos(bundle, n.address) for n in (cp1, cp2, cp3)}
    said = etcd_health.problem(clients.__getitem__, list(clients), DEADLINE)  # what the product's gate reads
    assert said is not None and f"({cp3.address}) does not answer" in said, said

    state = control.power_on(cp3.address, port=CONTROL_PORT)
    assert state["mode"] == "configured" and state["boot_id"] != before["boot_id"] and state["etcd"] == "member"
    assert members(bundle, cp1.address) == ids  # the same member, on its own data
    etcd = etcd_service(bundle, cp3.address)
    assert (etcd.state, etcd.healthy) == ("Running", True)
    talos(bundle, cp1.address).health_check([n.address for n in (cp1, cp2, cp3)], [worker.address], wait_timeout=5)


def test_a_member_removed_while_its_machine_was_down_fails_its_etcd_until_a_reset(bundle, cluster):
    lab, (cp1, cp2, cp3), worker = cluster
    cp3.crash()
    talos(bundle, cp1.address).etcd_remove_member(members(bundle, cp1.address)[cp3.hostname])
    cp3.power_on()

    assert talos(bundle, cp3.address).version().tag  # it answers its Talos API
    etcd = etcd_service(bundle, cp3.address)
    assert (etcd.state, etcd.healthy) == ("Waiting", False)
    assert cp3.hostname not in members(bundle, cp1.address)  # it did not add itself back
    problem = health_problem(bundle, cp1.address, [cp1, cp2, cp3])
    assert f'{cp3.address}: service "etcd" not in expected state "Running": current state [Waiting]' in problem
    assert "the member has been permanently removed from the cluster" in problem
    assert control.read_state(cp3.address, port=CONTROL_PORT)["etcd"] == "removed"

    boots = cp3.boots
    talos(bundle, cp3.address).reset(graceful=False, reboot=True, system_partitions=["EPHEMERAL"])
    cp3.wait_for("configured", UP, after_boot=boots)
    assert cp3.hostname in members(bundle, cp1.address)  # a new member on an empty data directory
    etcd = etcd_service(bundle, cp3.address)
    assert (etcd.state, etcd.healthy) == ("Running", True)
    talos(bundle, cp1.address).health_check([n.address for n in (cp1, cp2, cp3)], [worker.address], wait_timeout=5)


def test_a_crashed_worker_times_out_and_comes_back(bundle, cluster):
    lab, (cp1, cp2, cp3), worker = cluster
    boot_id = worker.boot_id
    assert control.crash(worker.address, port=CONTROL_PORT)["mode"] == "crashed"
    assert_times_out(lambda: talos(bundle, worker.address).version(timeout=DEADLINE))
    problem = health_problem(bundle, cp1.address, [cp1, cp2, cp3], [worker])
    assert "apid to be ready" in problem and worker.address in problem
    assert control.power_on(worker.address, port=CONTROL_PORT)["mode"] == "configured"
    assert worker.boot_id != boot_id and talos(bundle, worker.address).version().tag
