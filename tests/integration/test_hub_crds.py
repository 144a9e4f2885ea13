"""The hub CRDs on a real kube-apiserver: Established, schema-validated, status subresource on."""

from __future__ import annotations

import stat

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum.hub import crds as hub
from lab import crds as lab_crds
from lab.controlplane import free_port
from lab.hub import Hub

T = 10  # request timeout, seconds


@pytest.fixture(scope="module")
def custom(apiserver):
    api = kconfig.new_client_from_config_dict(yaml.safe_load(apiserver.admin_kubeconfig()))
    lab_crds.apply(api, hub.manifests())
    yield client.CustomObjectsApi(api)
    api.close()


def _instance(name: str, interfaces, **extra) -> dict:
    return {
        "apiVersion": hub.API_VERSION, "kind": hub.INSTANCE_KIND,
        "metadata": {"name": name, "labels": {hub.LABEL_REGION: "eu", hub.LABEL_ZONE: "eu-1a"}},
        "spec": {"interfaces": interfaces}, **extra,
    }


def _kontinuum(name: str, spec: dict) -> dict:
    return {"apiVersion": hub.API_VERSION, "kind": hub.KONTINUUM_KIND, "metadata": {"name": name}, "spec": spec}


def _create(custom, plural, body):
    return custom.create_cluster_custom_object(hub.GROUP, hub.VERSION, plural, body, _request_timeout=T)


def _rejected(custom, plural, body) -> str:
    with pytest.raises(client.ApiException) as e:
        _create(custom, plural, body)
    assert e.value.status == 422, e.value.body
    return e.value.body


def test_valid_objects_are_accepted(custom):
    inst = _create(custom, hub.INSTANCE_PLURAL, _instance("eu-eu-1a-0a1b2c3d", ["127.0.0.10", "127.0.0.11"]))
    assert inst["spec"]["interfaces"] == ["127.0.0.10", "127.0.0.11"]
    k = _create(custom, hub.KONTINUUM_PLURAL, _kontinuum("eu-eu-1a", {"region": "eu", "zone": "eu-1a", "endpoint": "eu-1a.eu.lab"}))
    assert k["spec"]["zone"] == "eu-1a"


def test_schema_rejects_bad_objects(custom):
    assert "spec.interfaces" in _rejected(custom, hub.INSTANCE_PLURAL, _instance("no-addresses", []))
    body = _instance("no-spec", ["127.0.0.10"])
    del body["spec"]
    assert "spec" in _rejected(custom, hub.INSTANCE_PLURAL, body)
    assert "spec.zone" in _rejected(custom, hub.KONTINUUM_PLURAL, _kontinuum("no-zone", {"region": "eu"}))
    assert "spec.region" in _rejected(custom, hub.KONTINUUM_PLURAL, _kontinuum("bad-region", {"region": "EU!", "zone": "a"}))


def test_status_is_a_subresource(custom):
    name = "eu-eu-1a-status"
    created = _create(custom, hub.INSTANCE_PLURAL, _instance(name, ["127.0.0.12"], status={"discovered": True}))
    assert "status" not in created or not created["status"].get("discovered")  # main endpoint ignores status

    status = {
        "discovered": True, "talosVersion": "v1.13.0",
        "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01", "addresses": ["127.0.0.12/8"]}],
        "conditions": [{"type": "Discovered", "status": "True", "reason": "Probed", "message": "answered on 127.0.0.12",
                        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}],
    }
    got = custom.patch_cluster_custom_object_status(hub.GROUP, hub.VERSION, hub.INSTANCE_PLURAL, name,
                                                    {"status": status}, _request_timeout=T)
    assert got["status"] == status

    bad = {"status": {"conditions": [dict(status["conditions"][0], status="Maybe")]}}
    with pytest.raises(client.ApiException) as e:
        custom.patch_cluster_custom_object_status(hub.GROUP, hub.VERSION, hub.INSTANCE_PLURAL, name, bad, _request_timeout=T)
    assert e.value.status == 422

    _create(custom, hub.KONTINUUM_PLURAL, _kontinuum("eu-eu-1b", {"region": "eu", "zone": "eu-1b"}))
    got = custom.patch_cluster_custom_object_status(hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, "eu-eu-1b",
                                                    {"status": {"heartbeat": "2026-01-01T00:00:05Z"}}, _request_timeout=T)
    assert got["status"]["heartbeat"] == "2026-01-01T00:00:05Z"


def test_printer_columns_render(custom):
    table = custom.api_client.call_api(
        f"/apis/{hub.GROUP}/{hub.VERSION}/{hub.INSTANCE_PLURAL}", "GET",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        response_type="object", _return_http_data_only=True, _request_timeout=T,
    )
    assert [c["name"] for c in table["columnDefinitions"]][1:] == ["Claimed-By", "Lost", "Discovered", "Talos", "Age"]


def test_hub_starts_restarts_and_keeps_its_data(tools_bin, tmp_path):
    address = "127.0.0.2"
    hub_ = Hub(tmp_path / "hub", address=address, port=free_port(address),
               etcd_ports=(free_port(address), free_port(address)))
    try:
        hub_.start()
        assert stat.S_IMODE(hub_.kubeconfig_path.stat().st_mode) == 0o600
        with hub_.api_client() as api:
            client.CoreV1Api(api).read_namespace(hub.HUB_NAMESPACE, _request_timeout=T)
            _create(client.CustomObjectsApi(api), hub.KONTINUUM_PLURAL,
                    _kontinuum("eu-eu-1a", {"region": "eu", "zone": "eu-1a"}))
        before = hub_.kubeconfig
        hub_.stop()
        assert not hub_.running()

        again = Hub(tmp_path / "hub", address=address, port=hub_.control_plane.apiserver_port,
                    etcd_ports=hub_.control_plane.etcd_ports).start()
        hub_ = again
        old = kconfig.new_client_from_config_dict(yaml.safe_load(before))  # the first kubeconfig still works
        with old:
            k = client.CustomObjectsApi(old).get_cluster_custom_object(
                hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, "eu-eu-1a", _request_timeout=T)
        assert k["spec"]["region"] == "eu"
    finally:
        hub_.stop()
