"""CA rotation over real sockets (kontinuum/talos/rotate.py): emulated Talos nodes whose control
plane is a REAL kube-apiserver built from the machine config's cluster CA, restarted by the lab
with the new chain on each phase as Talos restarts it.

After every phase: which client certificates work (old ones until the drop, new ones from the
accept on), which CA serves; a Kubernetes API poller runs throughout. A rotation stopped right
after one node's patch resumes where the nodes are, without re-patching that node.
Addresses 127.0.48.8/29 are this module's own (control plane .11, worker .12)."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kconfig

from kontinuum.talos import ca_rotation as cr
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import rotate, secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec
from kontinuum.talos.errors import TalosError
from lab.cluster_manager import ClusterManager
from lab.process import wait_until
from lab.talos_node import Lab
from tests.integration import lab_cni

CP, WORKER = "127.0.48.11", "127.0.48.12"
ENDPOINT = f"https://{CP}:6443"
NAME = "rot-lab"


@pytest.fixture(scope="module")
def zone(tools_bin: Path, tmp_path_factory):
    missing = [t for t in ("etcd", "kube-apiserver", "kwok") if not (tools_bin / t).exists()]
    if missing:
        pytest.fail(f"pinned tools missing from {tools_bin}: {', '.join(missing)}; run `make tools`")
    bundle = secrets.generate()
    spec = ClusterSpec(name=NAME, endpoint=ENDPOINT, kubernetes_version="1.35.4", workers=(PoolSpec("web", 1),))
    with Lab(pool="127.0.48.8/29", reboot_delay=0.2) as lab, \
            ClusterManager(lab.clusters, tmp_path_factory.mktemp("rot") / "clusters", standins=False) as mgr:
        for a, pool in ((CP, CONTROLPLANE), (WORKER, "web")):
            lab.add_node(a)
            TalosClient.maintenance(a).apply_config(mc.render(spec, bundle, pool=pool))
        for a in (CP, WORKER):
            lab.node(a).wait_for("configured", 10)
        talos(bundle.os.crt, bundle.os, CP).bootstrap()
        wait_until("the lab apiserver", lambda: works(bundle.k8s.crt, bundle.k8s), 120)
        # Nodes turn Ready with a CNI agent on them; the rotation's check waits for every Node Ready.
        api = kconfig.new_client_from_config_dict(yaml.safe_load(talos(bundle.os.crt, bundle.os, CP).kubeconfig()))
        wait_until("the apiserver to take the CNI stand-in", lambda: lab_cni.install(api), 120)
        wait_until("every Node Ready", lambda: not rotate.not_ready_nodes(api.sanitize_for_serialization(
            client.CoreV1Api(api).list_node(_request_timeout=10))) and len(client.CoreV1Api(api).list_node().items) == 2, 120)
        api.close()
        yield lab, mgr, bundle


def talos(server_ca: bytes, client_ca, node: str) -> TalosClient:
    text = talosconfig.render(NAME, [node], [node], server_ca, talosconfig.issue_client_cert(client_ca))
    return TalosClient.from_talosconfig(talosconfig.parse(text), node=node, endpoint=node)


def talos_works(server_ca: bytes, client_ca) -> bool:
    try:
        return all(talos(server_ca, client_ca, n).version(timeout=5).tag for n in (CP, WORKER))
    except TalosError:
        return False


def works(server_ca: bytes, client_ca, cert=None) -> bool:
    try:
        return bool(rotate.k8s_version(ENDPOINT, server_ca, cert or rotate.k8s_client_cert(client_ca), 5))
    except (OSError, ValueError):
        return False


class Poller:
    """GET /version every 0.2 s with whichever credentials work now; records the outages."""

    def __init__(self, pairs) -> None:
        self.pairs, self.stop, self.outages = pairs, threading.Event(), []
        self.answered = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        down_since = None
        while not self.stop.wait(0.2):
            if any(works(server, None, cert) for server, cert in self.pairs):
                self.answered += 1
                if down_since is not None:
                    self.outages.append(time.monotonic() - down_since)
                    down_since = None
            elif down_since is None:
                down_since = time.monotonic()
        if down_since is not None:
            self.outages.append(float("inf"))


def test_kubernetes_ca_rotation_phase_by_phase_with_a_resume(zone):
    lab, mgr, bundle = zone
    old, new = bundle.k8s, secrets.generate().k8s
    old_cert, new_cert = rotate.k8s_client_cert(old), rotate.k8s_client_cert(new)
    assert works(old.crt, None, old_cert) and not works(old.crt, None, new_cert)
    boots = {a: lab.node(a).boots for a in (CP, WORKER)}
    poller = Poller([(old.crt, old_cert), (new.crt, new_cert), (old.crt, new_cert), (new.crt, old_cert)])
    poller.thread.start()
    seen: dict[str, tuple] = {}
    stop_after_first_swap = {"armed": True}

    def log(line: str) -> None:
        if stop_after_first_swap["armed"] and "swap: 127.0.48.11 patched" in line:
            stop_after_first_swap["armed"] = False
            raise KeyboardInterrupt("killed mid-phase")  # the process dies right after one node's patch
        for phase in cr.PHASES:
            if line.endswith("done on 2 node(s)") and f": {phase} done" in line:
                # The check held over probes in a row; the lab's rolling restart may still have its old
                # apiserver on the shared port for a moment, as a load balancer's other backends would.
                wait_until("the lab apiserver on the configured chain", lambda: all(
                    r.ca_settled() for r in mgr.runners.values()), 60)
                seen[phase] = (works(old.crt, None, old_cert), works(old.crt, None, new_cert),
                               works(new.crt, None, old_cert), works(new.crt, None, new_cert))

    z = rotate.Zone(name=NAME, nodes=[rotate.Node(CP, True), rotate.Node(WORKER, False)], talos_cas=[bundle.os],
                    k8s_endpoint=ENDPOINT, timeout=120, log=log)
    rotation = rotate.Rotation("kubernetes", old, new)
    with pytest.raises(KeyboardInterrupt):
        rotate.run(z, rotation)
    applies = {a: lab.node(a).calls.get("ApplyConfiguration", 0) for a in (CP, WORKER)}
    done = rotate.run(z, rotation)  # resumes: the swap on the worker, then the drop
    poller.stop.set()
    poller.thread.join(10)
    assert done == ["Kubernetes CA: swap done on 2 node(s)", "Kubernetes CA: drop done on 2 node(s)"]
    assert {a: lab.node(a).calls.get("ApplyConfiguration", 0) - applies[a] for a in (CP, WORKER)} == {CP: 1, WORKER: 2}

    # (old server CA + old cert, old server + new cert, new server + old cert, new server + new cert)
    assert seen["accept"] == (True, True, False, False)  # new client certificates work from the accept on
    assert seen["swap"] == (False, False, True, True)  # the new CA serves; old certificates still work
    assert seen["drop"] == (False, False, False, True)  # old client certificates stop only now
    # The API answered throughout: the apiserver restarts roll (the new one shares the port until ready);
    # at most a single request fails at each hand-over (one queued on the old listener as it closes).
    assert poller.answered > 10 and max(poller.outages, default=0) < 1.0 and len(poller.outages) <= 3, poller.outages
    kubeconfig = yaml.safe_load(talos(bundle.os.crt, bundle.os, CP).kubeconfig())  # Talos mints from the new CA now
    assert base64.b64decode(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]) == new.crt
    assert {a: lab.node(a).boots for a in (CP, WORKER)} == boots  # no reboots


def test_talos_ca_rotation_switches_the_api_without_reboots(zone):
    lab, _, bundle = zone
    old, new = bundle.os, secrets.generate().os
    seen: dict[str, tuple] = {}

    def log(line: str) -> None:
        if line.endswith("done on 2 node(s)"):
            seen[line.split(": ")[1].split()[0]] = (talos_works(old.crt, old), talos_works(old.crt, new),
                                                    talos_works(new.crt, old), talos_works(new.crt, new))

    boots = {a: lab.node(a).boots for a in (CP, WORKER)}
    z = rotate.Zone(name=NAME, nodes=[rotate.Node(CP, True), rotate.Node(WORKER, False)], talos_cas=[new, old],
                    k8s_endpoint=ENDPOINT, timeout=60, log=log)
    assert len(rotate.run(z, rotate.Rotation("talos", old, new))) == 3
    assert seen["accept"] == (True, True, False, False)
    assert seen["swap"] == (False, False, True, True)
    assert seen["drop"] == (False, False, False, True)
    assert rotate.run(z, rotate.Rotation("talos", old, new)) == []  # done: nothing due, nothing patched
    assert {a: lab.node(a).boots for a in (CP, WORKER)} == boots
