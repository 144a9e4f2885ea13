"""Clearing the Helm release records a killed run left, on a real kube-apiserver: Helm's
storage layout (one Secret per revision, labels owner/name/status/version), the release's
objects untouched, and a cluster that does not answer named within the bound."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from kontinuum.kube import helm_records
from kontinuum.kube.clients import api_client

NS = "helm-records"


def record(core: client.CoreV1Api, release: str, revision: int, status: str) -> None:
    core.create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name=f"sh.helm.release.v1.{release}.v{revision}",
                                     labels={"owner": "helm", "name": release, "status": status,
                                             "version": str(revision)}),
        type="helm.sh/release.v1", data={"release": "e30="}))


def names(core: client.CoreV1Api, release: str) -> list[str]:
    items = core.list_namespaced_secret(NS, label_selector=f"owner=helm,name={release}").items
    return sorted(s.metadata.name for s in items)


@pytest.fixture(scope="module")
def core(apiserver):
    api = client.CoreV1Api(api_client(apiserver.admin_kubeconfig()))
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    yield api


def test_a_killed_install_loses_its_record_and_keeps_its_objects(apiserver, core):
    record(core, "cilium", 1, "pending-install")
    core.create_namespaced_config_map(NS, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="cilium-config", annotations={"meta.helm.sh/release-name": "cilium"})))
    cleared = helm_records.clear(apiserver.admin_kubeconfig(), NS, "cilium", "creating", timeout=10)
    assert [(r.revision, r.status) for r in cleared] == [(1, "pending-install")]
    assert names(core, "cilium") == []
    assert core.read_namespaced_config_map("cilium-config", NS).metadata.name == "cilium-config"


def test_a_killed_upgrade_loses_only_its_pending_revision(apiserver, core):
    record(core, "cert-manager", 1, "deployed")
    record(core, "cert-manager", 2, "pending-upgrade")
    cleared = helm_records.clear(apiserver.admin_kubeconfig(), NS, "cert-manager", "updating", timeout=10)
    assert [r.revision for r in cleared] == [2]
    assert names(core, "cert-manager") == ["sh.helm.release.v1.cert-manager.v1"]


def test_an_older_history_is_refused_for_a_pending_create(apiserver, core):
    record(core, "other", 1, "superseded")
    record(core, "other", 2, "deployed")
    with pytest.raises(helm_records.HelmRecordError, match=r"Helm release helm-records/other on https://.*: its "
                                                           r"history \(v1 superseded, v2 deployed\)"):
        helm_records.clear(apiserver.admin_kubeconfig(), NS, "other", "creating", timeout=10)
    assert len(names(core, "other")) == 2


def test_a_cluster_that_does_not_answer_is_named_within_the_bound(apiserver):
    dead = apiserver.admin_kubeconfig().replace(apiserver.server, "https://127.0.0.1:1")
    t0 = time.monotonic()
    with pytest.raises(helm_records.HelmRecordError, match=r"127\.0\.0\.1:1: did not answer within 5 s"):
        helm_records.clear(dead, NS, "cilium", "creating", timeout=5)
    assert time.monotonic() - t0 < 30
