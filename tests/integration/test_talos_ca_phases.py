"""The emulated nodes follow talosctl rotate-ca's Talos API CA phases (day-2 facts §4) applied by
hand, NO_REBOOT, one node at a time: accept the new CA (machine.acceptedCAs), swap the issuing CA
(machine.ca = new, the old one accepted), drop the old one. Old client certificates work until
the drop, new ones from the accept on (with the old server CA) and with the new PKI from the
swap on; no node reboots. Addresses 127.0.42.21-22 are this module's own.

(This proves the emulator answers the phases as Talos does, patched by hand; their orchestration
is tests/integration/test_ca_rotation_lab.py, through `pulumi up` tests/e2e/test_backup_engine.py.)"""

from __future__ import annotations

import base64

import pytest
import yaml

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import pki, secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec
from kontinuum.talos.errors import TalosError
from lab.process import wait_until
from lab.talos_node import Lab

CP, WORKER = "127.0.42.21", "127.0.42.22"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def patched(config: bytes, *, ca: pki.CertKey, accepted: list[bytes], control_plane: bool) -> bytes:
    doc = yaml.safe_load(config)
    doc["machine"]["ca"] = {"crt": b64(ca.crt), **({"key": b64(ca.key)} if control_plane else {})}
    doc["machine"]["acceptedCAs"] = [{"crt": b64(c)} for c in accepted]
    return yaml.safe_dump(doc, sort_keys=False).encode()


def client(server_cas: bytes, cert: pki.CertKey, node: str) -> TalosClient:
    text = talosconfig.render("rotate", [node], [node], server_cas, cert)
    return TalosClient.from_talosconfig(talosconfig.parse(text), node=node, endpoint=node)


def works(server_cas: bytes, cert: pki.CertKey) -> bool:
    try:
        return all(client(server_cas, cert, n).version(timeout=5).tag for n in (CP, WORKER))
    except TalosError:
        return False


def settles(what: str, server_cas: bytes, cert: pki.CertKey, *, working: bool) -> None:
    """apid reloads its certificates after the reply to the apply (in Talos too, by a
    controller): wait for the reload, bounded, as rotate-ca does."""
    wait_until(what, lambda: works(server_cas, cert) == working, timeout=15)


@pytest.fixture
def cluster():
    bundle = secrets.generate()
    spec = ClusterSpec(name="rotate", endpoint=f"https://{CP}:6443", kubernetes_version="1.35.4",
                       workers=(PoolSpec("web", 1),))
    configs = {CP: mc.render(spec, bundle), WORKER: mc.render(spec, bundle, pool="web")}
    with Lab(pool="127.0.42.20/30", reboot_delay=0.1) as lab:
        for a in (CP, WORKER):
            lab.add_node(a)
            TalosClient.maintenance(a).apply_config(configs[a])
        for a in (CP, WORKER):
            lab.node(a).wait_for("configured", 10)
        yield lab, bundle, configs


def test_talos_api_ca_phases_without_reboots(cluster):
    lab, bundle, configs = cluster
    old_ca, new_ca = bundle.os, secrets.generate().os
    old_cert, new_cert = talosconfig.issue_client_cert(old_ca), talosconfig.issue_client_cert(new_ca)
    boots = {a: lab.node(a).boots for a in (CP, WORKER)}
    assert works(old_ca.crt, old_cert) and not works(old_ca.crt, new_cert)

    def phase(ca: pki.CertKey, accepted: list[bytes], server_cas: bytes, cert: pki.CertKey) -> None:
        for node in (CP, WORKER):  # control planes first, one node at a time
            config = patched(configs[node], ca=ca, accepted=accepted, control_plane=node == CP)
            assert client(server_cas, cert, node).apply_config(config, mode="no-reboot").mode == "no-reboot"

    phase(old_ca, [new_ca.crt], old_ca.crt, old_cert)  # 1. accept the new CA
    settles("new client certificates accepted", old_ca.crt, new_cert, working=True)  # "intermediate" talosconfig
    assert works(old_ca.crt, old_cert)

    phase(new_ca, [old_ca.crt], old_ca.crt + new_ca.crt, old_cert)  # 2. swap: new issuing CA, old accepted
    settles("servers on the new CA", old_ca.crt, old_cert, working=False)  # servers present the new CA's certificates
    assert works(new_ca.crt, new_cert)  # the new PKI from the switch on
    assert works(new_ca.crt, old_cert)  # old client certificates until the drop

    phase(new_ca, [], new_ca.crt, new_cert)  # 3. drop the old CA
    settles("old client certificates refused", new_ca.crt, old_cert, working=False)  # only now
    assert works(new_ca.crt, new_cert)
    assert {a: lab.node(a).boots for a in (CP, WORKER)} == boots  # NO_REBOOT throughout
