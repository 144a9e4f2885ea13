"""Waits react to changes at once (issue 21), against a real kube-apiserver.

Each wait below runs with a pause interval far longer than its bound, so it looks again early
only when the watch wakes it; without the watch it would look again only at its bound."""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client

from kontinuum.kube import pods as pods_wait
from kontinuum.kube import watching
from kontinuum.kube.clients import api_client

LONG = 600.0  # the fallback interval: never reached within these bounds


@pytest.fixture(scope="module")
def kubeconfig(apiserver) -> str:
    return apiserver.admin_kubeconfig()


@pytest.fixture
def core(kubeconfig):
    api = api_client(kubeconfig)
    yield client.CoreV1Api(api)
    api.close()


def _namespace(core, name: str) -> str:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:  # pods need it; the controller-manager would create it a moment later
        core.create_namespaced_service_account(name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default")))
    except client.ApiException as e:
        if e.status != 409:
            raise
    return name


def _pod(core, ns: str, name: str) -> None:
    core.create_namespaced_pod(ns, client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "w"}),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="example.invalid/c:1")])))


def _make_ready(core, ns: str, name: str) -> None:
    """What a kubelet would report: Running and Ready (no kubelet runs here)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    core.patch_namespaced_pod_status(name, ns, {"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now},
                       {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
        "containerStatuses": [{"name": "c", "image": "example.invalid/c:1", "imageID": "", "ready": True,
                               "restartCount": 0, "started": True, "state": {"running": {"startedAt": now}}}]}})


def _later(seconds: float, fn, *args) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn(*args)), daemon=True)
    t.start()
    return t


def test_pods_wait_returns_when_a_pod_becomes_ready(core, kubeconfig):
    ns = _namespace(core, "watch-ready")
    _pod(core, ns, "p")
    _later(1.0, _make_ready, core, ns, "p")
    t0 = time.monotonic()
    assert pods_wait.wait_healthy(kubeconfig, ns, selector="app=w", timeout=30, interval=LONG) == 1
    # Without the watch the wait would look again only at its bound (30 s), not when the pod changed.
    assert time.monotonic() - t0 < 15


def test_pods_wait_keeps_its_bound_and_message(core, kubeconfig):
    ns = _namespace(core, "watch-stuck")
    _pod(core, ns, "p")
    t0 = time.monotonic()
    with pytest.raises(pods_wait.PodsNotHealthy, match="not healthy after 2 s; stuck: p"):
        pods_wait.wait_healthy(kubeconfig, ns, timeout=2, interval=LONG)
    assert time.monotonic() - t0 < 10  # the bound holds although the interval is 600 s


def test_a_watch_the_server_ends_is_reopened(core, kubeconfig, monkeypatch):
    monkeypatch.setattr(watching, "WATCH_SECONDS", 1)
    ns = _namespace(core, "watch-reopen")
    with watching.Waker((kubeconfig, watching.pods(ns))) as waker:
        time.sleep(3.5)  # the server has ended the first watches; an empty namespace sends nothing
        assert not waker.pause(0.2)
        _later(0.5, _pod, core, ns, "late")
        assert waker.pause(20)


def test_without_a_usable_kubeconfig_a_pause_is_the_full_interval():
    with watching.Waker(("not: [a kubeconfig", watching.pods("x"))) as waker:
        t0 = time.monotonic()
        assert not waker.pause(0.5)
        assert time.monotonic() - t0 >= 0.5
