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
