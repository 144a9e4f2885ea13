"""Run a CA rotation against a zone's nodes (the phases of kontinuum/talos/ca_rotation.py).

Every step reads the truth first: a node's live config (COSI MachineConfig) says which phase
it is in, so a rotation killed anywhere continues where the nodes are and never repeats a
patch. After each phase the zone is verified the way talosctl does: the Talos API with the
client that must work now (Version on every node), the Kubernetes API with a client
certificate of the new CA and the CA that must issue the serving certificate now.
"""

from __future__ import annotations

import ssl
import urllib.request
from dataclasses import dataclass
from typing import Callable

from kontinuum.errors import KontinuumError
from kontinuum.talos import ca_rotation as cr
from kontinuum.talos import pki, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.errors import TalosError, WrongModeError
from kontinuum.talos.pki import CertKey
from kontinuum.talos.transport import APID_PORT, load_cert_chain
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


def run(zone: Zone, rotation: Rotation) -> list[str]:
    """Take every node through the due phases; returns what was done (one line per phase)."""
    k, title = rotation.kind, cr.TITLE[rotation.kind]
    done: list[str] = []
    while True:
        states = {}
        for node in zone.nodes:
            read = _read(zone, node)
            if read is not None:
                states[node.address] = cr.state_of(cr.node_cas(read[1], k), rotation.old.crt, rotation.new.crt)
        phase = cr.due_phase(list(states.values()))
        if phase is None:
            return done
        target = cr.STATES[cr.PHASES.index(phase) + 1]
        for node in zone.nodes:  # control planes first, one node at a time
            read = _read(zone, node)
            if read is None or cr.STATES.index(cr.state_of(cr.node_cas(read[1], k), rotation.old.crt,
                                                            rotation.new.crt)) >= cr.STATES.index(target):
                continue
            c, config = read
            patched = cr.patch(config, k, phase, old=rotation.old.crt, new=rotation.new,
                               control_plane=node.control_plane)
            c.apply_config(patched, mode="no-reboot", timeout=min(60.0, zone.timeout))
            zone.log(f"{title} rotation, {phase}: {node.address} patched (NO_REBOOT)")
        _verify(zone, rotation, phase)
        done.append(f"{title}: {phase} done on {len(states)} node(s)")
        zone.log(done[-1])


def _verify(zone: Zone, rotation: Rotation, phase: str) -> None:
    if rotation.kind == "talos":
        # The "intermediate" client (old server CA, new client certificate) after accept, the new PKI after.
        server = rotation.old.crt if phase == "accept" else rotation.new.crt
        _wait(zone, f"the Talos API of every node to answer with {'the intermediate' if phase == 'accept' else 'the new'} "
              "talosconfig", lambda left: _talos_answers(zone, server, rotation.new, left))
    else:
        server = rotation.old.crt if phase == "accept" else rotation.new.crt
        _wait(zone, f"the Kubernetes API at {zone.k8s_endpoint} to serve with the {'old' if phase == 'accept' else 'new'} "
              "CA and accept a client certificate of the new one",
              lambda left: _k8s_answers(zone.k8s_endpoint, server, rotation.new, left))


def _wait(zone: Zone, what: str, probe: Callable[[float], None]) -> None:
    try:
        wait_until(what, probe, timeout=zone.timeout, remedy="")
    except WaitTimeout as exc:
        raise RotationFailed(f"CA rotation of zone {zone.name}: waited {exc.bound:g} s for {what}; last observation: "
                             f"{exc.last}. Check the nodes, then run `pulumi up` again: the rotation resumes where the "
                             "nodes are") from None


def _talos_answers(zone: Zone, server_ca: bytes, client_ca: CertKey, left: float) -> None:
    for node in zone.nodes:
        text = talosconfig.render(zone.name, [node.address], [node.address], server_ca,
                                  talosconfig.issue_client_cert(client_ca))
        c = TalosClient.from_talosconfig(talosconfig.parse(text), node=node.address, endpoint=node.address,
                                         port=zone.port)
        try:
            c.version(timeout=max(1.0, min(left, 10.0)))
        except WrongModeError:
            continue
        except TalosError as exc:
            raise NotYet(f"{node.address}: {exc.problem}") from None


def k8s_client_cert(ca: CertKey, common_name: str = "kontinuum-ca-rotation") -> CertKey:
    return pki.issue_cert(ca, common_name=common_name, organizations=["system:masters"], client=True,
                          key_type="ecdsa", days=1)


def k8s_version(endpoint: str, server_ca: bytes, client: CertKey, timeout: float) -> str:
    """GET /version over mTLS: the serving certificate must chain to `server_ca`."""
    ctx = ssl.create_default_context(cadata=server_ca.decode())
    load_cert_chain(ctx, client.crt, client.key)
    with urllib.request.urlopen(f"{endpoint.rstrip('/')}/version", context=ctx, timeout=timeout) as r:
        return r.read().decode()


def _k8s_answers(endpoint: str, server_ca: bytes, client_ca: CertKey, left: float) -> None:
    try:
        k8s_version(endpoint, server_ca, k8s_client_cert(client_ca), max(1.0, min(left, 5.0)))
    except (OSError, ValueError) as exc:
        raise NotYet(str(getattr(exc, "reason", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
