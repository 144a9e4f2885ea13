"""lab/pod_api.py: where a process the lab runs for a pod dials, from the pod's own env."""

from __future__ import annotations

import socket
import time

import pytest

from lab import pod_api

SVC = ("10.96.0.1", 443)
PRISM = [{"name": "KUBERNETES_SERVICE_HOST", "value": "localhost"}, {"name": "KUBERNETES_SERVICE_PORT", "value": "7445"}]


@pytest.fixture(scope="module")
def hole():
    h = pod_api.BlackHole("127.0.69.30")
    yield h
    h.close()


def pod(env=None, host_network=True) -> dict:
    return {"spec": {"hostNetwork": host_network, "containers": [{"name": "c", "env": env or []}]}}


def test_kubeprism_override_dials_the_machines_own_listener(hole):
    r = pod_api.resolve(pod(PRISM), machine="127.0.43.21", service=SVC, dataplane=False, black_hole=hole)
    assert (r.host, r.port, r.server_name, r.asked) == ("127.0.43.21", 7445, "localhost", "localhost:7445")


def test_service_ip_needs_the_dataplane_else_never_connects(hole):
    up = pod_api.resolve(pod(), machine="127.0.43.21", service=SVC, dataplane=True, black_hole=hole)
    assert (up.host, up.port, up.server_name) == ("127.0.43.21", 7445, "10.96.0.1")
    down = pod_api.resolve(pod(), machine="127.0.43.21", service=SVC, dataplane=False, black_hole=hole)
    assert (down.host, down.port, down.asked) == (hole.address, hole.port, "10.96.0.1:443")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):  # a connect that never completes, ended by the client's bound
        socket.create_connection((down.host, down.port), timeout=1.0)
    assert time.monotonic() - t0 >= 0.9


def test_other_addresses_never_leave_the_machine(hole):
    r = pod_api.resolve(pod([{"name": "KUBERNETES_SERVICE_HOST", "value": "192.168.1.10"}]), machine="127.0.43.21",
                        service=SVC, dataplane=True, black_hole=hole)
    assert (r.host, r.port) == (hole.address, hole.port)
    r = pod_api.resolve(pod([{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.43.99"},
                             {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]), machine="127.0.43.21",
                        service=SVC, dataplane=True, black_hole=hole)
    assert (r.host, r.port) == ("127.0.43.99", 6443)


def test_kubeprism_port_from_the_machine_config():
    import yaml
    on = yaml.safe_dump({"version": "v1alpha1", "machine": {"features": {"kubePrism": {"enabled": True, "port": 7445}}}})
    off = yaml.safe_dump({"version": "v1alpha1", "machine": {"features": {}}})
    assert pod_api.kubeprism_port(on.encode()) == 7445 and pod_api.kubeprism_port(off.encode()) is None


def test_an_exited_container_is_reported_as_a_kubelet_does():
    from lab.pod_processes import container_status
    p = {"spec": {"containers": [{"name": "manager", "image": "i"}]},
         "status": {"containerStatuses": [{"name": "manager", "state": {"running": {"startedAt": "t0"}}}]}}
    cs = container_status(p, running=False, restarts=1, exit_code=1, log_tail="dial tcp: i/o timeout")["status"]
    [c] = cs["containerStatuses"]
    assert c["state"]["waiting"]["reason"] == "CrashLoopBackOff" and c["restartCount"] == 1 and not c["ready"]
    assert c["lastState"]["terminated"] == {"exitCode": 1, "reason": "Error", "startedAt": "t0",
                                            "finishedAt": c["lastState"]["terminated"]["finishedAt"]}
    assert {x["type"]: x["status"] for x in cs["conditions"]} == {"ContainersReady": "False", "Ready": "False"}
    p["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    cs = container_status(p, running=False, restarts=2, exit_code=1, log_tail="dial tcp: i/o timeout")["status"]
    assert cs["containerStatuses"][0]["lastState"]["terminated"]["message"] == "dial tcp: i/o timeout"
