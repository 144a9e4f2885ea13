"""Manifest bundles read in Python: what the Gateway API CRDs become, and clear errors."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from kontinuum.errors import ConfigError
from kontinuum.kube import manifests
from kontinuum.kube.manifests import ManifestError
from kontinuum.stackconfig import specs
from kontinuum.stackconfig.parse import parse

ROOT = Path(__file__).resolve().parents[2]
CRD = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: %s}
spec: {group: x.test}
status: {acceptedNames: {kind: ""}}
"""


def test_upstream_gateway_api_directory_loads_every_crd_in_name_order():
    from lab import upstream

    objs = manifests.load(str(upstream.prepare("gateway-api")))  # the pinned standard channel
    names = [o["metadata"]["name"] for o in objs]
    assert names == ["gatewayclasses.gateway.networking.k8s.io", "gateways.gateway.networking.k8s.io",
                     "grpcroutes.gateway.networking.k8s.io", "httproutes.gateway.networking.k8s.io",
                     "referencegrants.gateway.networking.k8s.io"]
    assert {o["kind"] for o in objs} == {"CustomResourceDefinition"}


def test_multi_document_file_drops_status_and_empty_documents(tmp_path):
    f = tmp_path / "bundle.yaml"
    f.write_text("---\n" + CRD % "a.x.test" + "---\n# only a comment\n---\n" + CRD % "b.x.test")
    objs = manifests.load(str(f))
    assert [o["metadata"]["name"] for o in objs] == ["a.x.test", "b.x.test"]
    assert all("status" not in o for o in objs)


@pytest.mark.parametrize("text, problem", [
    ("a: 1\nb: [", "not valid YAML (line 2)"),
    ("- just\n- a list\n", "document 1 is not a Kubernetes object"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "document 1 is not a Kubernetes object"),
    (CRD % "a.x.test" + "---\n" + CRD % "a.x.test", "the same object twice: CustomResourceDefinition/a.x.test"),
])
def test_bad_bundles_are_refused_saying_where(tmp_path, text, problem):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ManifestError) as e:
        manifests.load(str(f))
    assert str(f) in str(e.value) and problem in str(e.value)


def test_missing_paths_are_refused(tmp_path):
    with pytest.raises(ManifestError, match="no such file or directory"):
        manifests.load(str(tmp_path / "nope"))
    with pytest.raises(ManifestError, match="a directory without"):
        manifests.load(str(tmp_path))


class _Handler(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).hits += 1
        body = (CRD % "u.x.test").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


def test_url_is_fetched_once_then_served_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KONTINUUM_CACHE", str(tmp_path))
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/standard-install.yaml"
        assert manifests.load(url)[0]["metadata"]["name"] == "u.x.test"
        assert manifests.load(url)[0]["metadata"]["name"] == "u.x.test"
        assert _Handler.hits == 1
    finally:
        server.shutdown()
        server.server_close()


def test_unreachable_url_fails_bounded_saying_what_to_do(tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("KONTINUUM_CACHE", str(tmp_path))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(ManifestError) as e:
        manifests.load(f"http://127.0.0.1:{port}/x.yaml", timeout=5)
    assert "cannot download" in str(e.value) and "local copy" in str(e.value)
    assert not list((tmp_path / "manifests").glob("*")) if (tmp_path / "manifests").exists() else True


def test_zone_validation_names_the_gateway_api_field(tmp_path):
    stack = parse({"region": "eu", "hub": {"dnsDomain": "x.test", "grpcEndpoint": "hub.x.test:443",
                                                  "acme": {"email": "a@x.test"}, "auth": {"mode": "anonymous"}},
                          "zones": [{"zone": "a", "talosAddresses": ["10.0.0.5"],
                                     "addons": {"gatewayApi": {"source": str(tmp_path / "missing")}}}]})
    with pytest.raises(ConfigError) as e:
        specs.validate("eu-a", stack.zones[0], "zones[0].")
    assert e.value.path == "zones[0].addons.gatewayApi.source" and "no such file" in str(e.value)
