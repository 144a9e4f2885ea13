"""Machines declared lost in the stack config (`lost: true`), taken out of their zone without
ever waiting on them (DESIGN §11; failure facts §3).

Talos's order for a failed control plane is "remove it first, then add the replacement", so
this runs before any machine joins: the dead etcd members are removed by ID through a healthy
control plane after checking that the members left keep quorum (Talos adds no check of its
own), and the lost machines' Nodes are deleted so their pods move. A declared machine that
still answers is refused (it is not lost: remove it normally), and nothing is removed on a
guess. A lost machine that answers again after it was taken out still holds the old config
and secrets (its etcd would crash-loop, "member has been permanently removed"), so it is
reset back to maintenance mode before anything can use it again.

Every step reads the truth first (membership, Nodes), so a run killed anywhere is resumed by
running it again, and no member is removed twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from grpclib.const import Status

from kontinuum.errors import KontinuumError
from kontinuum.lifecycle.etcd_health import member_address, running_healthy
from kontinuum.talos.answers import EtcdMember
from kontinuum.talos.errors import NodeUnreachableError, TalosError, TalosTimeoutError, TlsTrustError

if TYPE_CHECKING:
    from kontinuum.talos.client import TalosClient

PROBE_TIMEOUT = 5.0  # seconds a lost machine gets to show it answers (a dead host never does)
RESET_PARTITIONS = ("STATE", "EPHEMERAL")  # back to maintenance mode, as Talos's own advice for a removed member
RESTORE_HINT = ("restore the zone's etcd from a backup onto the machines that answer and new ones: "
                "`python -m kontinuum restore --stack <stack> --zone <zone> --snapshot <file>` (README: Lost machines)")


class LostMachineError(KontinuumError):
    """A lost machine cannot be taken out safely; the message says why and what to do."""


@dataclass(frozen=True)
class LostMachine:
    name: str  # its hub Instance
    address: str
    role: str  # "controlplane" | "worker"
    path: str  # where it is in the stack config, e.g. zones[0].talosAddresses[3]


ClientFor = Callable[[str], "TalosClient"]


def answers(client: TalosClient, timeout: float = PROBE_TIMEOUT) -> str | None:
    """"configured" (it takes our client certificate), "other" (it answers TLS but not as one of
    this cluster's nodes: maintenance mode or another cluster) or None (no answer at all)."""
    try:
        client.version(timeout=timeout)
        return "configured"
    except (NodeUnreachableError, TalosTimeoutError):
        return None
    except TlsTrustError:
        return "other"
    except TalosError:
        return "configured"  # it answered, and refused the call itself


def quorum_problem(members: list[EtcdMember], lost: set[str], healthy: set[str]) -> str | None:
    """None when removing the lost members leaves a working majority of the current membership
    (the majority etcd itself needs to change membership); else what is wrong. Pure."""
    total = len(members)
    gone = sorted(f"{m.hostname} ({member_address(m)})" for m in members if member_address(m) in lost)
    alive = [member_address(m) for m in members if member_address(m) not in lost]
    able = [a for a in alive if a in healthy]
    if len(able) * 2 > total:
        return None
    sick = sorted(set(alive) - set(able))
    return (f"etcd has {total} member{'s' * (total != 1)}; {len(gone)} of them lost ({', '.join(gone)})"
            + (f" and {', '.join(sick)} not healthy" if sick else "")
            + f", so {len(able)} cannot make the majority of {total // 2 + 1} etcd needs to remove a member")


def _healthy_members(client_for: ClientFor, addresses: Iterable[str]) -> set[str]:
    healthy = set()
    for address in addresses:
        client = client_for(address)
        try:
            services = client.service_list(timeout=min(PROBE_TIMEOUT * 2, client.deadlines.service_list))
        except TalosError:
            continue
        if running_healthy(services):
            healthy.add(address)
    return healthy


def _members_through(client_for: ClientFor, control_planes: list[str], zone: str) -> tuple[str, list[EtcdMember]]:
    problems = []
    for address in control_planes:
        client = client_for(address)
        try:
            return address, client.etcd_members(timeout=min(PROBE_TIMEOUT * 2, client.deadlines.etcd))
        except TalosError as exc:
            problems.append(f"{address}: {exc.problem}")
    raise LostMachineError(f"zone {zone}: no control plane that is not marked lost answers the etcd member list "
                           f"({'; '.join(problems) or 'none is listed'}), so no lost member can be removed. If "
                           f"they are gone too, mark them lost and {RESTORE_HINT}")


def refuse_answering(new: list[LostMachine], client_for: ClientFor, zone: str) -> None:
    """A machine marked lost that answers is not lost: refused before anything changes."""
    alive = [m for m in new if answers(client_for(m.address)) is not None]
    if alive:
        lines = [f"{m.path} ({m.address})" for m in alive]
        raise LostMachineError(
            f"zone {zone}: marked lost but answering its Talos API: {', '.join(lines)}. A lost machine is one that "
            "is gone for good; this one is not. Remove `lost: true`; to take it out of the zone, remove it from "
            "talosAddresses instead (it is drained, leaves etcd and is reset). Nothing was changed.")


def remove_members(new: list[LostMachine], handled: list[LostMachine], *, client_for: ClientFor,
                   control_planes: list[str], zone: str, log: Callable[[str], None]) -> None:
    """Remove the etcd members of lost control planes by ID through a healthy control plane,
    after the quorum check. Lost machines taken out earlier are counted as lost too."""
    lost = {m.address for m in [*new, *handled] if m.role == "controlplane"}
    if not lost:
        return
    through, members = _members_through(client_for, control_planes, zone)
    dead = [m for m in members if member_address(m) in lost]
    if not dead:
        return
    alive = [member_address(m) for m in members if member_address(m) not in lost]
    if problem := quorum_problem(members, lost, _healthy_members(client_for, alive)):
        raise LostMachineError(f"zone {zone}: not removing lost etcd members: {problem}. Nothing was removed; "
                               f"{RESTORE_HINT}")
    client = client_for(through)
    for member in dead:
        try:
            client.etcd_remove_member(member.id, timeout=client.deadlines.etcd)
        except TalosError as exc:
            if exc.status != Status.NOT_FOUND:  # gone already: a resumed run
                raise
        log(f"zone {zone}: removed etcd member {member.id:016x} ({member.hostname}, {member_address(member)}) of a "
            f"lost control plane through {through}")


def delete_nodes(new: list[LostMachine], kubeconfig: str | None, zone: str, log: Callable[[str], None]) -> None:
    """Delete the lost machines' Nodes: their pods are then collected and run elsewhere."""
    from kubernetes import client as k8s

    from kontinuum.kube.clients import api_client
    from kontinuum.kube.drain import REQUEST_TIMEOUT, node_for

    if kubeconfig is None:
        raise LostMachineError(f"zone {zone}: no control plane hands out a kubeconfig, so the Nodes of "
                               f"{', '.join(m.address for m in new)} cannot be deleted; run `pulumi up` again once "
                               "one answers")
    api = api_client(kubeconfig)
    try:
        core = k8s.CoreV1Api(api)
        for m in new:
            node = node_for(core, m.address)
            if node is None:
                continue
            try:
                core.delete_node(node.metadata.name, _request_timeout=REQUEST_TIMEOUT)
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
            log(f"zone {zone}: deleted Node {node.metadata.name} of lost machine {m.address}; its pods move")
    finally:
        api.close()


def reset_returned(handled: list[LostMachine], client_for: ClientFor, zone: str, log: Callable[[str], None],
                   after_reset: Callable[[LostMachine], None],
                   remove_nodes: Callable[[list[LostMachine]], None]) -> list[str]:
    """A lost machine that answers again with this cluster's config is reset to maintenance mode
    (STATE + EPHEMERAL, not graceful: it is no member to leave); `after_reset` waits for it there
    and records its new maintenance certificate, which a later apply to it needs, and the Node
    its kubelet registered again meanwhile goes. The addresses reset."""
    reset = []
    for m in handled:
        client = client_for(m.address)
        if answers(client) != "configured":
            continue
        client.reset(graceful=False, reboot=True, system_partitions=list(RESET_PARTITIONS),
                     timeout=client.deadlines.reset)
        log(f"zone {zone}: lost machine {m.path} ({m.address}) answers again with its old config and secrets; reset "
            "it to maintenance mode so it cannot rejoin. Remove `lost: true` to use it again")
        after_reset(m)
        remove_nodes([m])
        reset.append(m.address)
    return reset


def take_out(lost: list[LostMachine], handled: set[str], *, client_for: ClientFor, control_planes: list[str],
             remove_nodes: Callable[[list[LostMachine]], None], after_reset: Callable[[LostMachine], None],
             zone: str, log: Callable[[str], None]) -> dict:
    """The whole step; `handled`: names taken out by an earlier run; `remove_nodes`: deletes the
    Nodes of the machines named (delete_nodes with the cluster's kubeconfig); `after_reset`: see
    reset_returned. Returns what the state keeps."""
    new = [m for m in lost if m.name not in handled]
    old = [m for m in lost if m.name in handled]
    refuse_answering(new, client_for, zone)
    remove_members(new, old, client_for=client_for, control_planes=control_planes, zone=zone, log=log)
    if new:
        remove_nodes(new)
    reset = reset_returned(old, client_for, zone, log, after_reset, remove_nodes)
    return {"handled": sorted(m.name for m in lost), "reset": reset}
