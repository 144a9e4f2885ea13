"""Draining a leaving machine's Node against a real kube-apiserver and controller-manager:
cordon, evict what a controller would move, respect PodDisruptionBudgets within a bound."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from kontinuum.kube.clients import api_client
from kontinuum.kube.drain import DrainTimeout, delete_node, drain


@pytest.fixture(scope="module")
def kubeconfig(apiserver) -> str:
    return apiserver.admin_kubeconfig()


@pytest.fixture
def core(kubeconfig):
    api = api_client(kubeconfig)
    core = client.CoreV1Api(api)
    try:  # pods need the namespace's default ServiceAccount, which no controller may have made yet
        core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
    except client.ApiException as e:
        assert e.status == 409
    yield core
    api.close()


def _node(core, name: str, address: str) -> None:
    core.create_node({"metadata": {"name": name}})
    core.patch_node_status(name, {"status": {"addresses": [{"type": "InternalIP", "address": address}]}})


def _pod(core, name: str, node: str, *, labels=None, owner=None, annotations=None, running=False) -> None:
    meta = {"name": name, "namespace": "default", "labels": labels or {}, "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "o", "uid": "0e1f0000-0000-0000-0000-000000000001"}]
    core.create_namespaced_pod("default", {"metadata": meta, "spec": {
        "nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/c:1"}]}})
    if running:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        core.patch_namespaced_pod_status(name, "default", {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now}]}})


def _live(core, node: str) -> set[str]:
    pods = core.list_namespaced_pod("default", field_selector=f"spec.nodeName={node}").items
    return {p.metadata.name for p in pods if p.metadata.deletion_timestamp is None}


def test_drain_cordons_and_evicts_what_a_controller_moves(core, kubeconfig):
    _node(core, "leaving", "127.0.77.1")
    _pod(core, "app-1", "leaving", running=True)
    _pod(core, "agent-1", "leaving", owner="DaemonSet", running=True)
    _pod(core, "static-1", "leaving", annotations={"kubernetes.io/config.mirror": "x"}, running=True)
    lines = []
    assert drain(kubeconfig, "127.0.77.1", timeout=20, log=lines.append) == "leaving"
    assert core.read_node("leaving").spec.unschedulable is True
    assert _live(core, "leaving") == {"agent-1", "static-1"}  # DaemonSet and static pods go with the machine
    assert lines == ["127.0.77.1: Node leaving cordoned and drained"]
    delete_node(kubeconfig, "leaving")
    delete_node(kubeconfig, "leaving")  # gone already: fine
    assert drain(kubeconfig, "127.0.77.1", timeout=5, log=lines.append) is None


def test_a_disruption_budget_that_allows_nothing_stops_the_drain_bounded(core, kubeconfig):
    _node(core, "guarded", "127.0.77.2")
    _pod(core, "db-1", "guarded", labels={"app": "db"}, running=True)
    client.PolicyV1Api(core.api_client).create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "db"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}})
    started = time.monotonic()
    with pytest.raises(DrainTimeout) as err:
        drain(kubeconfig, "127.0.77.2", timeout=3, log=lambda _: None)
    assert time.monotonic() - started < 3 + 15
    text = str(err.value)
    assert "default/db-1: a PodDisruptionBudget allows no disruption now" in text and "was not reset" in text
    assert "db-1" in _live(core, "guarded")
