"""The lab's own Gateway API and cert-manager CRDs apply cleanly and serve every kind they name."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client, config as kconfig

from lab import crds as lab_crds

T = 10
NS = "default"


@pytest.fixture(scope="module")
def api(apiserver):
    a = kconfig.new_client_from_config_dict(yaml.safe_load(apiserver.admin_kubeconfig()))
    yield a
    a.close()


def _samples(manifests: list[dict]):
    """One minimal object per kind and served version: (crd, version, body)."""
    for crd in manifests:
        spec = crd["spec"]
        for v in spec["versions"]:
            name = f"sample-{v['name']}"
            body = {"apiVersion": f"{spec['group']}/{v['name']}", "kind": spec["names"]["kind"],
                    "metadata": {"name": name}, "spec": {"anything": {"goes": [1, "two"]}}}
            yield crd, v["name"], body


def _create_all(api, manifests):
    custom = client.CustomObjectsApi(api)
    for crd, version, body in _samples(manifests):
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        name = body["metadata"]["name"]
        if crd["spec"]["scope"] == "Cluster":
            custom.create_cluster_custom_object(group, version, plural, body, _request_timeout=T)
            got = custom.patch_cluster_custom_object_status(
                group, version, plural, name, {"status": {"conditions": []}}, _request_timeout=T)
        else:
            custom.create_namespaced_custom_object(group, version, NS, plural, body, _request_timeout=T)
            got = custom.patch_namespaced_custom_object_status(
                group, version, NS, plural, name, {"status": {"conditions": []}}, _request_timeout=T)
        assert got["spec"] == body["spec"] and got["status"] == {"conditions": []}, (plural, version)


def test_gateway_api_crds_apply_and_serve_every_kind(api):
    manifests = lab_crds.gateway_api()
    lab_crds.apply(api, manifests)
    lab_crds.apply(api, manifests)  # re-applying converges
    _create_all(api, manifests)
    resources = client.CustomObjectsApi(api).api_client.call_api(
        "/apis/gateway.networking.k8s.io/v1", "GET", response_type="object", _return_http_data_only=True,
        _request_timeout=T)
    short = {r["name"]: r.get("shortNames", []) for r in resources["resources"]}
    assert short["gatewayclasses"] == ["gc"] and short["gateways"] == ["gtw"]


def test_cert_manager_crds_apply_and_serve_every_kind(api):
    manifests = lab_crds.cert_manager()
    lab_crds.apply(api, manifests)
    _create_all(api, manifests)
