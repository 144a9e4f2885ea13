"""Teardown of one machine when it leaves its cluster (ConfigApply's delete): its Node is
cordoned and drained first (kubectl drain's order, PodDisruptionBudgets respected), control
planes then leave etcd and fail closed when that fails (a reset member would cost the cluster
quorum); then a reset back to maintenance mode (STATE + EPHEMERAL, as Talos documents, or
the whole system disk with wipe=disk), waited for, and the machine's new maintenance
certificate recorded on its hub Instance, which the next apply to it requires, and its Node
object removed. Every step is bounded by resetTimeout and retried while the node is off the
network.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from kontinuum.errors import KontinuumError
from kontinuum.lifecycle import etcd_health
from kontinuum.talos.errors import TalosError, TlsTrustError
from kontinuum.talos.waits import NotYet, WaitTimeout, wait_until
from providers.talos_common import (TRANSIENT, cluster_kubeconfig, info, machine_inventory, maintenance_client,
                                     node_client, warn)

if TYPE_CHECKING:  # made by talos_common where a call is made
    from kontinuum.talos.client import TalosClient

WIPES = {"state": ("STATE", "EPHEMERAL"), "disk": ()}  # system partitions a reset wipes; () = the disk
DRAIN_BOUND = 300.0  # seconds at most for a drain (and half of what is left of resetTimeout)


class NodeNotResetError(KontinuumError):
    """Delete refused to reset a node, or could not."""



class _InMaintenance(Exception):
    """The node answered in maintenance mode: it is reset already."""


def _in_maintenance(props: dict, left: float) -> bool:
    client = maintenance_client(props)
    try:
        client.discover(timeout=min(left, client.deadlines.discover))
    except TalosError:
        return False
    return True


def _teardown_step(props: dict, what: str, call: Callable[[float], object], started: float) -> object:
    """One mTLS step of the teardown, retried while the node is off the network. Raises
    _InMaintenance when the node turns out to be reset already."""

    def attempt(left: float) -> object:
        try:
            return call(left)
        except TRANSIENT as exc:
            if isinstance(exc, TlsTrustError) and _in_maintenance(props, left):
                raise _InMaintenance() from exc
            raise NotYet(exc.problem) from exc

    return wait_until(
        f"ConfigApply {props['address']}: {what}",
        attempt,
        timeout=float(props["resetTimeout"]),
        started=started,
        remedy=(
            "The node did not take the call. Power it on or fix the network and run again; if the machine is "
            "gone for good, mark it `lost: true` in the zone's talosAddresses (README: Lost machines)."
        ),
    )


def _etcd_membership(client: TalosClient) -> str:
    """"none", "last" or "member": how this control plane relates to etcd right now."""
    services = {s.id: s for s in client.service_list()}
    etcd = services.get("etcd")
    if etcd is None or etcd.state != "Running":
        return "none"
    return "last" if len(client.etcd_members()) <= 1 else "member"


QUORUM_GATE = 60.0  # seconds at most to see etcd healthy with every member before one leaves


def _quorum_gate(props: dict, client: TalosClient) -> None:
    """Leave only while etcd is healthy with every member: then the members that stay keep
    quorum (control planes leave one at a time: the zone chains them). A node that does not
    list members (not bootstrapped, or reset already) has nothing to guard."""
    try:
        found = client.etcd_members()
    except TalosError:
        return
    addresses = sorted({etcd_health.member_address(m) for m in found})
    if len(addresses) <= 1:
        return
    bound = min(QUORUM_GATE, float(props["resetTimeout"]))
    try:
        etcd_health.wait_healthy(lambda a: node_client(props, a), addresses, timeout=bound,
                                 why=f"before control plane {props['address']} leaves")
    except etcd_health.EtcdUnhealthyError as exc:
        raise NodeNotResetError(f"ConfigApply {props['address']}: not leaving etcd: {exc}") from None


def _leave_etcd(props: dict, client: TalosClient, started: float) -> bool:
    """Leave etcd; True when the node was a member of a live cluster. Fails closed: only
    "there is nothing to leave" lets the reset go ahead after a failure."""
    address = props["address"]
    _quorum_gate(props, client)
    try:
        _teardown_step(props, "leave etcd", lambda left: client.etcd_leave(timeout=min(left, client.deadlines.etcd)), started)
        info(f"{address}: left the etcd cluster")
        return True
    except TalosError as exc:
        failure = exc
    try:
        membership = _etcd_membership(client)
    except TalosError as exc:
        membership = f"could not be read ({exc.problem})"
    if membership == "none":
        info(f"{address}: etcd does not run here (never bootstrapped, or left already); nothing to leave")
        return False
    if membership == "last":
        info(f"{address}: the last etcd member; the cluster's etcd goes away with it")
        return False
    raise NodeNotResetError(
        f"ConfigApply {address}: leaving etcd failed ({failure.problem}) and the node is still an etcd member "
        f"(membership {membership}). Not resetting it: a reset member would cost the cluster quorum. Fix etcd on "
        f"the node (`talosctl -n {address} service etcd`) or remove the member through another control plane "
        "(`talosctl etcd remove-member`), then run again; to reset without leaving, set leaveEtcdOnDelete: false."
    ) from failure


def teardown(props: dict) -> None:
    """Leave etcd (control planes), reset, wait for maintenance mode; all within resetTimeout."""
    address = props["address"]
    if props.get("resetOnDelete") is False:
        info(f"{address}: resetOnDelete is false; the node keeps its config")
        return
    if _declared_lost(props):
        info(f"{address}: declared lost; its etcd member and Node were removed before, so it is not called")
        return
    started = time.monotonic()
    client = node_client(props)
    leave = props.get("leaveEtcdOnDelete")
    if leave is None:
        leave = props.get("role") == "controlplane"
    drained = None if props.get("skipUnreachable") or props.get("drain") is False else _drain(props, started)
    try:
        graceful = _leave_etcd(props, client, started) if leave else True
        _teardown_step(
            props,
            "accept the reset",
            lambda left: client.reset(graceful=graceful, reboot=True, system_partitions=WIPES[props.get("wipe") or "state"],
                                      timeout=min(left, client.deadlines.reset)),
            started,
        )
    except _InMaintenance:
        info(f"{address}: already in maintenance mode; nothing to reset")
        if drained is not None:
            _remove_node(*drained, address)
        return
    except WaitTimeout as exc:
        if props.get("skipUnreachable"):
            warn(f"{address}: skipped, unreachable (skipUnreachable is set); last observation: {exc.last}")
            return
        raise
    info(f"{address}: reset (graceful={graceful}); waiting for it to come back in maintenance mode")

    back_in_maintenance(
        props, f"ConfigApply {address}: the node to come back in maintenance mode after its reset",
        timeout=float(props["resetTimeout"]), started=started,
        remedy=("The reset may still be wiping disks (raise resetTimeout) or hung: check the machine's console, then "
                "run again. After a whole-disk wipe (wipe: disk) a machine comes back only if it boots from the "
                "network or an ISO."))
    if drained is not None:
        _remove_node(*drained, address)


def back_in_maintenance(props: dict, what: str, *, timeout: float, remedy: str, started: float | None = None) -> None:
    """Wait (bounded) for the reset machine at props["address"] in maintenance mode, then record
    its new maintenance certificate on its Instance (props["instance"]): the next apply pins it."""

    def back(left: float):
        maintenance = maintenance_client(props)
        try:
            return maintenance.discover(timeout=min(left, maintenance.deadlines.discover))
        except TalosError as exc:
            raise NotYet(exc.problem) from exc

    _record(props, wait_until(what, back, timeout=timeout, started=started, remedy=remedy))


def _declared_lost(props: dict) -> bool:
    """The machine's Instance carries the lost mark (set from the stack config, LostMachines
    took it out): a teardown must not wait on a dead machine."""
    from kontinuum.hub.crds import LABEL_LOST

    inv = machine_inventory(props)
    obj = inv.get(props["instance"]) if inv is not None else None
    return bool(obj) and (obj.get("metadata", {}).get("labels") or {}).get(LABEL_LOST) == "true"


def _record(props: dict, found) -> None:
    """The machine's new maintenance certificate on its hub Instance: what the next apply to it
    pins. An Instance already unregistered has nothing to record it on."""
    inv = machine_inventory(props)
    if inv is None:
        return
    from kontinuum.hub.discovery import record_found
    from kontinuum.hub.inventory import HubError

    if inv.get(props["instance"]) is None:
        info(f"{props['address']}: Instance {props['instance']} is not registered; its new certificate is not recorded")
        return
    try:
        record_found(inv, props["instance"], found)
    except HubError as exc:
        warn(f"{props['address']}: its new maintenance certificate was not recorded ({exc}); "
             "the next apply to it needs its Instance replaced (`pulumi up --replace`)")


def _drain(props: dict, started: float) -> tuple[str, str] | None:
    """Cordon and drain the machine's Node (PodDisruptionBudgets respected) before anything is
    reset: (kubeconfig, node name) to remove the Node afterwards, or None when there is no
    cluster to drain from (never bootstrapped, or gone: said in the log). A drain that does not
    finish within the bound fails the teardown before the machine is touched."""
    from kontinuum.kube.clients import describe_error
    from kontinuum.kube.drain import DrainTimeout, drain

    address = props["address"]
    kubeconfig = cluster_kubeconfig(props, first=props["address"] if props.get("role") == "controlplane" else None)
    if kubeconfig is None:
        info(f"{address}: no control plane hands out a kubeconfig (not bootstrapped, or gone); nothing to drain")
        return None
    left = float(props["resetTimeout"]) - (time.monotonic() - started)
    try:
        name = drain(kubeconfig, address, timeout=max(1.0, min(left / 2, DRAIN_BOUND)), log=info)
    except DrainTimeout:
        raise
    except Exception as e:  # noqa: BLE001 - an API server that does not answer cannot be drained
        warn(f"{address}: the cluster's API server did not answer ({describe_error(e)}); not drained")
        return None
    return (kubeconfig, name) if name else None


def _remove_node(kubeconfig: str, name: str, address: str) -> None:
    """The reset machine's kubelet is gone: its Node object would stay NotReady forever (and
    fail Talos's health check as an unexpected node), so it goes too. Best effort: a cluster
    that went away with its last control plane has no Node left to remove."""
    from kontinuum.kube.clients import describe_error
    from kontinuum.kube.drain import delete_node

    try:
        delete_node(kubeconfig, name)
        info(f"{address}: Node {name} removed from the cluster")
    except Exception as e:  # noqa: BLE001
        info(f"{address}: Node {name} not removed ({describe_error(e)}); the cluster went with it or is down")
