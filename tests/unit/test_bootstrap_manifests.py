"""The bootstrap-manifest sync's pure parts (kontinuum/lifecycle/bootstrap_manifests.py) and the
lab's rendering of Talos's manifests from a machine config (lab/talos_node/manifests.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from kontinuum.lifecycle import bootstrap_manifests as bm
from lab.talos_node import manifests as lab_manifests


def test_apply_order_is_talosctls_stages_keeping_the_order_within_each():
    objs = [{"kind": k, "metadata": {"name": n}} for k, n in
            [("DaemonSet", "a"), ("ConfigMap", "b"), ("Namespace", "c"), ("Secret", "d"),
             ("ServiceAccount", "e"), ("CustomResourceDefinition", "f")]]
    assert [o["metadata"]["name"] for o in bm.ordered(objs)] == ["c", "f", "b", "d", "a", "e"]


@pytest.mark.parametrize("obj,problem", [
    ({"kind": "ConfigMap"}, None),
    ({"kind": "DaemonSet", "metadata": {"generation": 2},
      "status": {"observedGeneration": 1, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 2}},
     "generation 2 not observed yet (at 1)"),
    ({"kind": "DaemonSet", "metadata": {"generation": 2},
      "status": {"observedGeneration": 2, "desiredNumberScheduled": 2, "updatedNumberScheduled": 1, "numberAvailable": 2}},
     "1/2 pods updated, 2/2 available"),
    ({"kind": "DaemonSet", "metadata": {"generation": 2},
      "status": {"observedGeneration": 2, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 2}},
     None),
    ({"kind": "Deployment", "metadata": {"generation": 1}, "spec": {"replicas": 2},
      "status": {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 2, "replicas": 3}},
     "2/2 replicas updated, 2/2 ready, 3 in all"),
    ({"kind": "Deployment", "metadata": {"generation": 1}, "spec": {},
      "status": {"observedGeneration": 1, "updatedReplicas": 1, "availableReplicas": 1, "replicas": 1}}, None),
])
def test_rolled_out(obj, problem):
    assert bm.rolled_out(obj) == problem


def test_lab_renders_kube_proxy_only_when_enabled_with_the_configs_image():
    doc = {"cluster": {"proxy": {"disabled": True, "image": "registry.k8s.io/kube-proxy:v1.35.5"}}}
    assert list(lab_manifests.render(doc)) == ["11-kube-config-in-cluster"]
    doc["cluster"]["proxy"]["disabled"] = False
    rendered = lab_manifests.render(doc)
    assert list(rendered) == ["10-kube-proxy", "11-kube-config-in-cluster"]
    assert bm.proxy_image(rendered["10-kube-proxy"]) == "registry.k8s.io/kube-proxy:v1.35.5"


def test_read_takes_every_object_of_every_resource_in_id_order():
    """As the emulator (and Talos) serve them: the spec of each resource is the YAML list of its objects."""
    rendered = lab_manifests.render({"cluster": {"proxy": {"image": "k/kube-proxy:v1"}}})
    replies = [(rid, yaml.safe_dump(items)) for rid, items in reversed(rendered.items())]
    talos = SimpleNamespace(node="127.0.49.9", _run=lambda op, t, body: replies)
    objects = bm.read(talos)
    assert [bm.describe(o) for o in objects] == [
        "ServiceAccount kube-system/kube-proxy", "ClusterRoleBinding kube-proxy", "DaemonSet kube-system/kube-proxy",
        "ConfigMap kube-system/kubeconfig-in-cluster"]
    broken = SimpleNamespace(node="127.0.49.9", _run=lambda op, t, body: [("10-x", "a: b")])
    with pytest.raises(bm.ManifestSyncError, match="127.0.49.9: bootstrap manifest 10-x is not a list"):
        bm.read(broken)


def _fields(buf: bytes):
    """(number, bytes) of each length-delimited field of a protobuf message."""
    i = 0
    while i < len(buf):
        tag, i = buf[i], i + 1
        n = shift = 0
        while True:
            c, i = buf[i], i + 1
            n, shift = n | (c & 0x7F) << shift, shift + 7
            if not c & 0x80:
                break
        yield tag >> 3, buf[i:i + n]
        i += n


def test_the_emulators_manifest_proto_spec_is_talos_manifestspec():
    """items = 1 (SingleManifest), object = 1 (google.protobuf.Struct): what Talos's Go client decodes."""
    from google.protobuf import json_format, struct_pb2

    from lab.talos_node import resources

    items = lab_manifests.render({"cluster": {"proxy": {"image": "k/kube-proxy:v1"}}})["10-kube-proxy"]
    decoded = []
    for number, single in _fields(resources._manifest_proto(items)):
        assert number == 1
        [(inner, raw)] = list(_fields(single))
        assert inner == 1
        struct = struct_pb2.Struct()
        struct.ParseFromString(raw)
        decoded.append(json_format.MessageToDict(struct))
    assert [(o["kind"], o["metadata"]["name"]) for o in decoded] == [(o["kind"], o["metadata"]["name"]) for o in items]
    assert bm.proxy_image(decoded) == "k/kube-proxy:v1"


class FakeApi:
    """ApiClient.call_api-shaped: discovery of apps/v1 and v1, a DaemonSet stuck half rolled out,
    and a refusal (status, body) for PATCHes when `refuse` is set."""

    def __init__(self, refuse=None):
        self.refuse = refuse
        self.patched: list[str] = []

    def call_api(self, path, method, **kw):
        from kubernetes import client

        if path in ("/api/v1", "/apis/apps/v1"):
            return {"resources": [{"name": "daemonsets", "kind": "DaemonSet", "namespaced": True},
                                  {"name": "configmaps", "kind": "ConfigMap", "namespaced": True},
                                  {"name": "daemonsets/status", "kind": "DaemonSet", "namespaced": True}]}
        if method == "PATCH":
            if self.refuse:
                e = client.ApiException(status=self.refuse[0], reason="Conflict")
                e.body = self.refuse[1]
                raise e
            assert kw["query_params"] == [("fieldManager", "talos"), ("force", "false")]
            assert kw["header_params"]["Content-Type"] == "application/apply-patch+yaml"
            self.patched.append(path)
            return {**kw["body"], "metadata": {**kw["body"]["metadata"], "generation": 2}}
        return {"kind": "DaemonSet", "metadata": {"generation": 2},
                "status": {"observedGeneration": 2, "desiredNumberScheduled": 2, "updatedNumberScheduled": 1,
                           "numberAvailable": 2}}


def test_apply_paths_and_a_stuck_workload_is_named_when_the_bound_runs_out():
    from kontinuum.talos.waits import WaitTimeout

    objects = lab_manifests.render({"cluster": {"proxy": {"disabled": True}}})["11-kube-config-in-cluster"] + \
        [o for o in lab_manifests.render({"cluster": {"proxy": {"image": "k/p:v1"}}})["10-kube-proxy"] if o["kind"] == "DaemonSet"]
    api = FakeApi()
    applied = bm.apply(api, objects, lambda m: None)
    assert api.patched == ["/api/v1/namespaces/kube-system/configmaps/kubeconfig-in-cluster",
                           "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy"]
    with pytest.raises(WaitTimeout) as err:
        bm.wait_reconciled(api, applied, timeout=0.3)
    assert "DaemonSet kube-system/kube-proxy: 1/2 pods updated, 2/2 available" in str(err.value)


def test_a_field_conflict_is_reported_with_the_apis_reason_not_forced():
    objects = [o for o in lab_manifests.render({"cluster": {"proxy": {"image": "k/p:v1"}}})["10-kube-proxy"]
               if o["kind"] == "DaemonSet"]
    body = '{"message": "Apply failed with 1 conflict: conflict with \\"kubectl-edit\\": .spec.template.spec.containers[name=\\"kube-proxy\\"].image"}'
    with pytest.raises(bm.ManifestSyncError) as err:
        bm.apply(FakeApi(refuse=(409, body)), objects, lambda m: None)
    text = str(err.value)
    assert "refused the bootstrap manifest DaemonSet kube-system/kube-proxy" in text
    assert 'conflict with "kubectl-edit"' in text and "Another field manager owns fields" in text
