"""Run a CA rotation against a zone's nodes (the phases of kontinuum/talos/ca_rotation.py).

Every step reads the truth first: a node's live config (COSI MachineConfig) says which phase
it is in, so a rotation killed anywhere continues where the nodes are and never repeats a
patch. After each phase the zone is verified the way talosctl does: the Talos API with the
client that must work now (Version on every node), the Kubernetes API with a client
certificate of the new CA and the CA that must issue the serving certificate now, held over a
few probes in a row (the endpoint may balance over apiservers that restart one by one).
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from dataclasses import dataclass
from typing import Callable

from kontinuum.errors import KontinuumError
from kontinuum.talos import ca_rotation as cr
from kontinuum.talos import pki, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.errors import TalosError, WrongModeError
from kontinuum.talos.pki import CertKey
from kontinuum.talos.talosconfig import APID_PORT
from kontinuum.talos.transport import load_cert_chain
from kontinuum.talos.waits import NotYet, WaitTimeout, wait_until

Log = Callable[[str], None]


@dataclass(frozen=True)
class Node:
    address: str
    control_plane: bool


@dataclass(frozen=True)
class Rotation:
    kind: cr.Kind
    old: CertKey  # the CA being retired (its key signs the clients that work until the drop)
    new: CertKey


class RotationFailed(KontinuumError):
    pass


@dataclass
class Zone:
    """How to reach the zone: its nodes (control planes first), the Talos CAs that may be in
    use (old and new while a Talos CA rotation runs) and the Kubernetes API endpoint."""

    name: str
    nodes: list[Node]
    talos_cas: list[CertKey]  # every Talos CA a node may issue with or accept right now
    k8s_endpoint: str
    port: int = APID_PORT
    timeout: float = 300.0
    log: Log = print

    def clients(self, address: str) -> list[TalosClient]:
        """A client per Talos CA (newest first), each trusting every CA a server may use now."""
        trust = b"".join(ca.crt for ca in self.talos_cas)
        made = []
        for ca in self.talos_cas:
            text = talosconfig.render(self.name, [address], [address], trust, talosconfig.issue_client_cert(ca))
            made.append(TalosClient.from_talosconfig(talosconfig.parse(text), node=address, endpoint=address,
                                                     port=self.port))
        return made


def _read(zone: Zone, node: Node) -> tuple[TalosClient, str] | None:
    """The node's live config and a client it accepts; None for a node in maintenance mode (it
    gets the final config from its ConfigApply)."""
    problems = []
    for c in zone.clients(node.address):
        try:
            return c, c.machine_config(timeout=min(30.0, zone.timeout))
        except WrongModeError:
            return None
        except TalosError as exc:
            problems.append(exc.problem)
    raise RotationFailed(f"CA rotation of zone {zone.name}: node {node.address} accepts none of our client "
                         f"certificates ({'; '.join(problems)}); check that it answers (`talosctl -n {node.address} "
                         "version`) and run `pulumi up` again: the rotation resumes where the nodes are")


def _state(zone: Zone, node: Node, config: str, rotation: Rotation) -> str:
    try:
        return cr.state_of(cr.node_cas(config, rotation.kind), rotation.old.crt, rotation.new.crt)
    except cr.RotationError as exc:
        raise RotationFailed(f"CA rotation of zone {zone.name}: node {node.address}: {exc} ({cr.TITLE[rotation.kind]}). "
                             "Was its token changed again before the last rotation finished? Nothing was patched "
                             "on it; bring its config back to the stack's CAs, then run `pulumi up` again") from None


def run(zone: Zone, rotation: Rotation) -> list[str]:
    """Take every node through the due phases; returns what was done (one line per phase)."""
    k, title = rotation.kind, cr.TITLE[rotation.kind]
    done: list[str] = []
    while True:
        states = {}
        for node in zone.nodes:
            read = _read(zone, node)
            if read is not None:
                states[node.address] = _state(zone, node, read[1], rotation)
        phase = cr.due_phase(list(states.values()))
        if phase is None:
            return done
        target = cr.STATES[cr.PHASES.index(phase) + 1]
        for node in zone.nodes:  # control planes first, one node at a time
            read = _read(zone, node)
            if read is None:
                continue
            c, config = read
            if k == "kubernetes":  # talosctl: PatchNodeConfigWithKubeletRestart, healthy before and after
                _wait_kubelet(zone, c, node)
            if cr.STATES.index(_state(zone, node, config, rotation)) >= cr.STATES.index(target):
                continue  # done before a kill: the truth says so, nothing is repeated
            patched = cr.patch(config, k, phase, old=rotation.old.crt, new=rotation.new,
                               control_plane=node.control_plane)
            since = _kubelet_last_event(c) if k == "kubernetes" else None
            c.apply_config(patched, mode="no-reboot", timeout=min(60.0, zone.timeout))
            zone.log(f"{title} rotation, {phase}: {node.address} patched (NO_REBOOT)")
            if k == "kubernetes":
                _wait_kubelet(zone, c, node, restarted_after=since)
        _verify(zone, rotation, phase)
        done.append(f"{title}: {phase} done on {len(states)} node(s)")
        zone.log(done[-1])


def _verify(zone: Zone, rotation: Rotation, phase: str) -> None:
    """Wait (bounded) until the zone shows the phase: after accept the old CA still serves and a
    client of the new one works (the "intermediate" client); after swap the new CA serves; after
    drop a client of the old CA is refused too."""
    server = rotation.old.crt if phase == "accept" else rotation.new.crt
    refused = rotation.old if phase == "drop" else None
    if rotation.kind == "talos":
        what = "the Talos API of every node to answer a client of the new CA" + (
            ", to serve with the new CA" if phase != "accept" else "") + (
            " and to refuse one of the old CA" if refused else "")
        _wait(zone, what, lambda left: _talos_answers(zone, server, rotation.new, refused, left))
    else:
        what = (f"the Kubernetes API at {zone.k8s_endpoint} to serve with the {'old' if phase == 'accept' else 'new'} "
                "CA and accept a client certificate of the new one" + (" and refuse one of the old" if refused else ""))
        _wait(zone, what, held(lambda left: _k8s_answers(zone.k8s_endpoint, server, rotation.new, refused, left)))


def held(probe: Callable[[float], None], passes: int = 3, seconds: float = 2.0,
         clock: Callable[[], float] = time.monotonic) -> Callable[[float], None]:
    """`probe`, passing only once it passed `passes` times in a row over at least `seconds`. The
    endpoint may be a load balancer: one answer can come from an apiserver that restarted on the
    new chain while another still runs on the old one."""
    streak: list[float] = []

    def probe_held(left: float) -> None:
        try:
            probe(left)
        except NotYet:
            streak.clear()
            raise
        streak.append(clock())
        if len(streak) < passes or streak[-1] - streak[0] < seconds:
            raise NotYet(f"it held for {len(streak)} probe(s) in a row; {passes} over {seconds:g} s must pass")

    return probe_held


def _kubelet_last_event(c: TalosClient) -> float:
    """The node-time stamp of the kubelet's newest service event (0: none)."""
    kubelet = next((s for s in c.service_list(timeout=10.0) if s.id == "kubelet"), None)
    return max((ts for _, ts in kubelet.events), default=0.0) if kubelet else 0.0


def _wait_kubelet(zone: Zone, c: TalosClient, node: Node, restarted_after: float | None = None) -> None:
    """Healthy on the node's chain; with `restarted_after`, only once the kubelet's events show
    it left Running after that moment and runs again (talosctl waits for its Service resource
    to go, then come back Running and healthy): a restart is observed, never assumed."""
    what = "to restart and run healthy" if restarted_after is not None else "to run healthy"
    _wait(zone, f"the kubelet on {node.address} {what} on the node's cluster CA chain",
          lambda left: _kubelet_healthy(c, left, restarted_after))


def _kubelet_healthy(c: TalosClient, left: float, restarted_after: float | None = None) -> None:
    try:
        services = {s.id: s for s in c.service_list(timeout=max(1.0, min(left, 10.0)))}
    except TalosError as exc:
        raise NotYet(exc.problem) from None
    kubelet = services.get("kubelet")
    if kubelet is None or kubelet.state != "Running" or not kubelet.healthy:
        raise NotYet(f"kubelet is {kubelet.state if kubelet else 'missing'}"
                     + (" and not healthy" if kubelet and not kubelet.healthy else ""))
    if restarted_after is not None and not restarted(kubelet.events, restarted_after):
        raise NotYet("the kubelet has not restarted since the patch")


def restarted(events: tuple[tuple[str, float], ...], after: float) -> bool:
    """Its events after `after` show it leave Running and then run again."""
    left = False
    for state, ts in events:
        if ts <= after:
            continue
        if state != "Running":
            left = True
        elif left:
            return True
    return False


def _wait(zone: Zone, what: str, probe: Callable[[float], None]) -> None:
    try:
        wait_until(what, probe, timeout=zone.timeout, remedy="")
    except WaitTimeout as exc:
        raise RotationFailed(f"CA rotation of zone {zone.name}: waited {exc.bound:g} s for {what}; last observation: "
                             f"{exc.last}. Check the nodes, then run `pulumi up` again: the rotation resumes where the "
                             "nodes are") from None


def _talos_answers(zone: Zone, server_ca: bytes, client_ca: CertKey, refused: CertKey | None, left: float) -> None:
    def client(address: str, ca: CertKey) -> TalosClient:
        text = talosconfig.render(zone.name, [address], [address], server_ca, talosconfig.issue_client_cert(ca))
        return TalosClient.from_talosconfig(talosconfig.parse(text), node=address, endpoint=address, port=zone.port)

    t = max(1.0, min(left, 10.0))
    for node in zone.nodes:
        try:
            client(node.address, client_ca).version(timeout=t)
        except WrongModeError:
            continue
        except TalosError as exc:
            raise NotYet(f"{node.address}: {exc.problem}") from None
        if refused is not None:
            try:
                client(node.address, refused).version(timeout=t)
            except TalosError:
                continue
            raise NotYet(f"{node.address} still accepts a client certificate of the old CA")


def k8s_client_cert(ca: CertKey, common_name: str = "kontinuum-ca-rotation") -> CertKey:
    return pki.issue_cert(ca, common_name=common_name, organizations=["system:masters"], client=True,
                          key_type="ecdsa", days=1)


def k8s_version(endpoint: str, server_ca: bytes, client: CertKey, timeout: float,
                path: str = "/api/v1/namespaces/kube-system") -> str:
    """GET an object only an authenticated admin may read (GET /version answers anyone), over TLS
    whose serving certificate must chain to `server_ca`; raises OSError when refused."""
    ctx = ssl.create_default_context(cadata=server_ca.decode())
    load_cert_chain(ctx, client.crt, client.key)
    with urllib.request.urlopen(f"{endpoint.rstrip('/')}{path}", context=ctx, timeout=timeout) as r:
        return r.read().decode()


def not_ready_nodes(node_list: dict) -> list[str]:
    """Nodes whose Ready condition is not True (talosctl rotate-ca's rule: a Node without a Ready
    condition is not counted)."""
    bad = []
    for node in node_list.get("items") or []:
        for c in (node.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") != "True":
                bad.append(f"{node['metadata']['name']} (Ready={c.get('status')})")
    return bad


def _k8s_answers(endpoint: str, server_ca: bytes, client_ca: CertKey, refused: CertKey | None, left: float) -> None:
    t = max(1.0, min(left, 5.0))
    try:
        nodes = json.loads(k8s_version(endpoint, server_ca, k8s_client_cert(client_ca), t, path="/api/v1/nodes"))
    except (OSError, ValueError) as exc:
        raise NotYet(_why(exc)) from None
    if bad := not_ready_nodes(nodes):
        raise NotYet(f"Node(s) not Ready: {', '.join(bad)}")
    if refused is not None:
        try:
            k8s_version(endpoint, server_ca, k8s_client_cert(refused), t)
        except (OSError, ValueError):
            return
        raise NotYet("it still accepts a client certificate of the old CA")


def _why(exc: Exception) -> str:
    text = str(getattr(exc, "reason", None) or exc)
    return text.splitlines()[0] if text else type(exc).__name__
