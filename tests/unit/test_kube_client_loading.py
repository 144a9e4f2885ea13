"""API clients built from kubeconfig text in parallel threads (a provider updating several
resources at once) each get their certificate files written before they use them."""

from __future__ import annotations

import builtins
import os
import threading
import time

import yaml
from kubernetes.config import kube_config

from kontinuum.kube.clients import api_client
from kontinuum.talos import pki
from lab.controlplane import kubeconfig_text


def test_a_client_built_beside_another_from_the_same_kubeconfig_has_its_ca_file_written(monkeypatch):
    ca = pki.new_ca(common_name="kubernetes")
    doc = yaml.safe_load(kubeconfig_text("c", "https://127.0.0.1:6443", ca.crt,
                                         pki.issue_cert(ca, common_name="admin", client=True, key_type="ecdsa")))
    doc["users"][0]["user"] = {"token": "t"}  # only the CA goes to a file: the loader has nothing else to write
    kubeconfig = yaml.safe_dump(doc)

    def slow_open(name, mode="r", *args, **kwargs):  # the loader's write of a temp file, on a loaded machine
        if "w" in mode:
            time.sleep(0.3)
        return builtins.open(name, mode, *args, **kwargs)

    monkeypatch.setattr(kube_config, "open", slow_open, raising=False)
    sizes: dict[str, int] = {}

    def build(name: str) -> None:
        path = api_client(kubeconfig).configuration.ssl_ca_cert
        sizes[name] = os.path.getsize(path)  # what TLS would load right now

    first = threading.Thread(target=build, args=("first",))
    first.start()
    time.sleep(0.1)  # the first is writing its files
    build("second")
    first.join()
    assert sizes == {"first": len(ca.crt), "second": len(ca.crt)}


def test_a_client_that_verifies_no_server_loads_no_trust_store_and_still_connects(tmp_path):
    """An insecure-skip-tls-verify kubeconfig (the lab's own) got certifi's whole bundle loaded
    into every new connection's TLS context (16 ms of CPU each); it now loads one certificate and
    still accepts any server, as insecure-skip-tls-verify says."""
    import certifi
    import http.server
    import json
    import ssl

    from kubernetes import client

    server_ca = pki.new_ca(common_name="someone-else")
    served = pki.issue_cert(server_ca, common_name="server", ip_addresses=["127.0.0.1"], server=True, key_type="ecdsa")
    (tmp_path / "s.crt").write_bytes(served.crt)
    (tmp_path / "s.key").write_bytes(pki.to_standard_pem(served.key))

    class Version(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps({"major": "1", "minor": "35", "gitVersion": "v1.35.4", "buildDate": "2026-01-01T00:00:00Z",
                               "compiler": "gc", "gitCommit": "x", "gitTreeState": "clean", "goVersion": "go1.25",
                               "platform": "linux/amd64"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Version)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        own_ca = pki.new_ca(common_name="kubernetes")
        doc = yaml.safe_load(kubeconfig_text("c", f"https://127.0.0.1:{httpd.server_address[1]}", own_ca.crt,
                                             pki.issue_cert(own_ca, common_name="admin", client=True, key_type="ecdsa")))
        cluster = doc["clusters"][0]["cluster"]
        cluster.pop("certificate-authority-data")
        cluster["insecure-skip-tls-verify"] = True
        api = api_client(yaml.safe_dump(doc))
        assert api.rest_client.pool_manager.connection_pool_kw["ca_certs"] != certifi.where()
        assert client.VersionApi(api).get_code(_request_timeout=5).git_version == "v1.35.4"
    finally:
        httpd.shutdown()
