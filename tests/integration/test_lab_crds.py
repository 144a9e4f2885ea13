"""The pinned upstream Gateway API and cert-manager CRDs (lab/crds, from their Go module zips)
apply and re-apply cleanly with the lab's bounded installer, and validate as upstream does."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client, config as kconfig

from lab import crds as lab_crds

T = 10


@pytest.fixture(scope="module")
def api(apiserver):
    a = kconfig.new_client_from_config_dict(yaml.safe_load(apiserver.admin_kubeconfig()))
    yield a
    a.close()


def _resources(api, group_version: str) -> dict[str, list[str]]:
    out = client.CustomObjectsApi(api).api_client.call_api(
        f"/apis/{group_version}", "GET", response_type="object", _return_http_data_only=True, _request_timeout=T)
    return {r["name"]: r.get("shortNames", []) for r in out["resources"] if "/" not in r["name"]}


def test_gateway_api_crds_apply_and_serve_every_kind(api):
    manifests = lab_crds.gateway_api()
    lab_crds.apply(api, manifests)
    lab_crds.apply(api, manifests)  # re-applying converges
    short = _resources(api, "gateway.networking.k8s.io/v1")
    assert short["gatewayclasses"] == ["gc"] and short["gateways"] == ["gtw"]
    assert {"httproutes", "grpcroutes"} <= set(short)
    with pytest.raises(client.ApiException) as refused:  # the upstream schema, not a permissive copy
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "gateway.networking.k8s.io", "v1", "default", "gateways",
            {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "g"},
             "spec": {"gatewayClassName": "cilium", "listeners": []}}, _request_timeout=T)
    assert refused.value.status == 422 and "spec.listeners" in refused.value.body


def test_cert_manager_crds_apply_and_serve_every_kind(api):
    lab_crds.apply(api, lab_crds.cert_manager())
    assert set(_resources(api, "cert-manager.io/v1")) == {"certificates", "certificaterequests", "issuers",
                                                           "clusterissuers"}
    assert set(_resources(api, "acme.cert-manager.io/v1")) == {"orders", "challenges"}
