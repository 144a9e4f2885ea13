"""CA rotation as `talosctl rotate-ca` does it (day-2 facts §4), as pure planning: which phase a
node's live machine config is in, the patch that takes it to the next phase, and the plan a
preview shows. No I/O here (kontinuum/talos/rotate.py runs the phases against nodes).

Phases per CA, every node one at a time (control planes first), each ApplyConfiguration NO_REBOOT:
1. accept: the new CA joins the accepted CAs (`machine.acceptedCAs` / `cluster.acceptedCAs`);
2. swap:   the new CA issues (`machine.ca` / `cluster.ca`; the key on control planes only), the
           old one moves to the accepted CAs;
3. clients: our talosconfig / kubeconfig switch to certificates of the new CA;
4. drop:   the old CA leaves the accepted CAs; its client certificates stop working.

A node's phase is read from its own config, so a rotation killed anywhere resumes where the
nodes are: a phase is due while any node has not reached it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Literal

import yaml
from cryptography.hazmat.primitives import hashes

from kontinuum.talos import pki
from kontinuum.talos.pki import CertKey

Kind = Literal["talos", "kubernetes"]
KINDS: tuple[Kind, ...] = ("talos", "kubernetes")
SECTION = {"talos": "machine", "kubernetes": "cluster"}
TITLE = {"talos": "Talos API CA", "kubernetes": "Kubernetes CA"}

# Node states in order; a phase takes every node to the state of the same index + 1.
START, ACCEPTED, SWAPPED, DONE = "start", "accepted", "swapped", "done"
STATES = (START, ACCEPTED, SWAPPED, DONE)
PHASES = ("accept", "swap", "drop")


@dataclass(frozen=True)
class NodeCAs:
    """What one node's config says about one CA kind."""

    issuing: bytes  # the CA certificate (PEM) that issues
    accepted: tuple[bytes, ...]  # further CA certificates accepted


class RotationError(ValueError):
    pass


def _same(a: bytes, b: bytes) -> bool:
    return pki.load_certificate(a).fingerprint(hashes.SHA256()) == pki.load_certificate(b).fingerprint(hashes.SHA256())


def _documents(config: str | bytes) -> list:
    return list(yaml.safe_load_all(config))


def _v1alpha1_index(docs: list) -> int:
    for i, doc in enumerate(docs):
        if isinstance(doc, dict) and doc.get("version") == "v1alpha1" and "kind" not in doc:
            return i
    raise RotationError("the machine config has no v1alpha1 document")


def node_cas(config: str | bytes, kind: Kind) -> NodeCAs:
    docs = _documents(config)
    section = docs[_v1alpha1_index(docs)].get(SECTION[kind]) or {}
    crt = ((section.get("ca") or {}).get("crt")) or ""
    accepted = tuple(base64.b64decode(c["crt"]) for c in section.get("acceptedCAs") or [] if c.get("crt"))
    return NodeCAs(base64.b64decode(crt) if crt else b"", accepted)


def state_of(cas: NodeCAs, old: bytes, new: bytes) -> str:
    """Where a node stands in the rotation from `old` to `new` (both CA certificates, PEM)."""
    issuing_new = bool(cas.issuing) and _same(cas.issuing, new)
    accepts = lambda ca: any(_same(a, ca) for a in cas.accepted)  # noqa: E731
    if issuing_new:
        return SWAPPED if accepts(old) else DONE
    if cas.issuing and not _same(cas.issuing, old):
        raise RotationError("the node's issuing CA is neither the old nor the new one of this rotation")
    return ACCEPTED if accepts(new) else START


def due_phase(states: list[str]) -> str | None:
    """The first phase some node still needs (None: every node is done). A node ahead of the
    others (killed mid-phase) never makes a later phase due before the earlier one finished."""
    lowest = min((STATES.index(s) for s in states), default=STATES.index(DONE))
    return None if lowest == STATES.index(DONE) else PHASES[lowest]


def patch(config: str | bytes, kind: Kind, phase: str, *, old: bytes, new: CertKey, control_plane: bool) -> str:
    """The config with `phase` applied to the CA `kind` (everything else kept, other documents too)."""
    docs = _documents(config)
    doc = docs[_v1alpha1_index(docs)]
    section = doc.setdefault(SECTION[kind], {})
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    accepted = [c for c in section.get("acceptedCAs") or [] if c.get("crt")]
    holds = lambda ca: any(_same(base64.b64decode(c["crt"]), ca) for c in accepted)  # noqa: E731
    without = lambda ca: [c for c in accepted if not _same(base64.b64decode(c["crt"]), ca)]  # noqa: E731
    if phase == "accept":
        accepted = accepted if holds(new.crt) else [*accepted, {"crt": b64(new.crt)}]
    elif phase == "swap":
        # A worker's config carries no Talos CA key; its Kubernetes CA is the certificate alone too.
        section["ca"] = {"crt": b64(new.crt), **({"key": b64(new.key)} if control_plane else {})}
        accepted = without(new.crt)
        accepted = accepted if holds(old) else [*accepted, {"crt": b64(old)}]
    elif phase == "drop":
        accepted = without(old)
    else:
        raise RotationError(f"unknown phase {phase!r}")
    if accepted:
        section["acceptedCAs"] = accepted
    else:
        section.pop("acceptedCAs", None)
    return yaml.safe_dump_all(docs, sort_keys=False)


def plan(kinds: list[Kind], nodes: list[str]) -> list[str]:
    """The phase plan a preview prints, one line per step."""
    order = ", ".join(nodes)
    lines = []
    for kind in kinds:
        t = TITLE[kind]
        lines += [
            f"{t}: 1. accept the new CA on every node ({order}), NO_REBOOT, one at a time",
            f"{t}: 2. swap: the new CA issues, the old one stays accepted (nodes rolled, no reboot)",
            f"{t}: 3. clients switched to certificates of the new CA"
            + (" (talosconfig)" if kind == "talos" else " (kubeconfig, the zone's Kubernetes provider)"),
            f"{t}: 4. drop the old CA; its client certificates stop working",
        ]
    return lines
