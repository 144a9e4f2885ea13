"""One node's Talos OS upgrade, talosctl 1.13's steps plus the checks talosctl leaves out
(reference/day2-facts.md §1, DESIGN §10). No Pulumi: providers/talos_upgrade.py calls it.

Resumable by reading the truth first: the node's running version decides whether anything is
done at all, so a re-run after a kill never upgrades a node twice, and a cordon of ours left by
a killed run is undone. The steps, each bounded:
  read version → (same as target: done) → version policy → [control plane: etcd healthy with
  every member] → pull installer → [drain: cordon + evict] → LifecycleService.Upgrade (exit
  code 0) → Reboot → wait for a new boot id and an answer → verify the TARGET version (an A/B
  rollback stops here, naming node and versions) → readiness gate (readiness.py: machine
  status, Node Ready with the new boot id, Cilium agent, static pods, etcd) → uncordon.
A failure before the reboot undoes our cordon; a node that rebooted and is not ready stays
cordoned, and the error says so.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

from kontinuum.errors import KontinuumError
from kontinuum.lifecycle import cordons, etcd_health, readiness, versions
from kontinuum.talos import lifecycle
from kontinuum.talos.client import TalosClient
from kontinuum.talos.errors import NodeUnreachableError, TalosTimeoutError, TlsTrustError
from kontinuum.talos.waits import WAIT_DEFAULTS, NotYet, wait_until

CORDON_REASON = "talos-upgrade"
_DOWN = (NodeUnreachableError, TalosTimeoutError, TlsTrustError)  # what a rebooting node shows
# A reboot is waited for with short, even pauses: the default backoff would add up to its
# longest pause to every node of a rollout.
_REBOOT_POLL = dataclasses.replace(WAIT_DEFAULTS, first_pause=0.1, max_pause=0.25)


class UpgradeRefused(KontinuumError):
    """The version policy forbids this upgrade; nothing was done."""


class RolledBackError(KontinuumError):
    """The node came back on its old version (A/B fallback after a failed boot)."""


@dataclass(frozen=True)
class NodeUpgrade:
    address: str
    name: str  # how messages name the node (its Instance)
    control_plane: bool
    target: str
    image: str  # installer image with the target's tag
    control_planes: tuple[str, ...]  # every control plane of the zone, for the etcd gate
    drain: bool
    allow_downgrade: bool
    timeout: float  # the whole node: install, reboot, answers again
    health_timeout: float  # each etcd gate
    drain_timeout: float


@dataclass(frozen=True)
class Context:
    client_for: Callable[[str], TalosClient]
    kubeconfig: Callable[[], str | None]  # the cluster's admin kubeconfig (None: API not reachable)
    log: Callable[[str], None]


def running_version(ctx: Context, node: NodeUpgrade, timeout: float) -> str:
    """The version the node runs now, waiting (bounded) while it is off the network (a reboot
    a killed run started may still be under way)."""
    client = ctx.client_for(node.address)

    def probe(left: float) -> str:
        try:
            return client.version(timeout=min(left, client.deadlines.version)).tag
        except _DOWN as e:
            raise NotYet(e.problem) from e

    return wait_until(f"{node.name} ({node.address}) to answer with its Talos version", probe, timeout=timeout,
                      bounds=_REBOOT_POLL, remedy="Check that the machine is on and reachable, then run `pulumi up` again.")


def _gate(ctx: Context, node: NodeUpgrade) -> readiness.Gate:
    return readiness.Gate(ctx.client_for, ctx.kubeconfig, node.control_planes)


def _target(node: NodeUpgrade) -> readiness.Target:
    return readiness.Target(node.address, node.name, node.control_plane)


def _wait_rebooted(ctx: Context, node: NodeUpgrade, before: str | None, started: float) -> str:
    """Wait until the node is back from its reboot and return the version it answers with."""
    client = ctx.client_for(node.address)
    went_down = False

    def probe(left: float) -> str:
        nonlocal went_down
        try:
            booted = lifecycle.boot_id(client, timeout=min(left, 10.0))
            version = client.version(timeout=min(left, client.deadlines.version)).tag
        except _DOWN as e:
            went_down = True
            raise NotYet(f"rebooting ({e.problem})") from e
        if (before is not None and booted == before) or (before is None and not went_down):
            raise NotYet("the node has not rebooted yet")
        return version

    return wait_until(f"{node.name} ({node.address}) to come back from its upgrade reboot", probe,
                      timeout=node.timeout, started=started, bounds=_REBOOT_POLL,
                      remedy="The node may still be installing or booting (raise timeouts.upgrade); check its "
                             "console, then run `pulumi up` again: a node already on the target is not touched again.")


def upgrade_node(ctx: Context, node: NodeUpgrade) -> str:
    """Bring one node to node.target; returns the version it runs afterwards (the target)."""
    started = time.monotonic()
    current = running_version(ctx, node, node.timeout)
    if versions.same(current, node.target):
        ctx.log(f"{node.address}: already runs Talos {current}")
        if node.drain:  # a killed run may have left our cordon
            cordons.resume(_gate(ctx, node), _target(node), reason=CORDON_REASON, timeout=node.timeout, log=ctx.log,
                           started=started)
        return current
    if (problem := versions.upgrade_problem(current, node.target, allow_downgrade=node.allow_downgrade)):
        raise UpgradeRefused(f"{node.name} ({node.address}): {problem}. Nothing was done to this node.")
    ctx.log(f"{node.address}: upgrading Talos {current} → {node.target} with {node.image}")
    if node.control_plane:
        etcd_health.wait_healthy(ctx.client_for, list(node.control_planes), timeout=node.health_timeout,
                                 why=f"before upgrading control plane {node.address}")
    client = ctx.client_for(node.address)
    before = lifecycle.boot_id(client)
    lifecycle.pull_installer(client, node.image)  # before the cordon: a failed pull leaves the node as it was
    gate = _gate(ctx, node)
    try:
        if node.drain:
            cordons.cordon(gate, _target(node), reason=CORDON_REASON, timeout=node.drain_timeout, log=ctx.log,
                           without_api="Bring the API back or set upgrade.drain: false, then run `pulumi up` again.")
        lifecycle.install_upgrade(client, node.image, on_progress=lambda line: ctx.log(f"{node.address}: {line}"))
        lifecycle.reboot(client)
    except Exception:
        if node.drain:  # nothing rebooted it: it must not stay cordoned
            cordons.try_uncordon(gate, node.address, reason=CORDON_REASON, log=ctx.log)
        raise
    ctx.log(f"{node.address}: installed {node.target}; rebooting")
    running = _wait_rebooted(ctx, node, before, started)
    if not versions.same(running, node.target):
        if node.drain:  # it runs (the old version); the rollout stops here
            cordons.uncordon(gate, node.address, reason=CORDON_REASON, log=ctx.log)
        raise RolledBackError(
            f"{node.name} ({node.address}) came back on Talos {running} instead of {node.target}: the new version "
            "failed to boot and the machine fell back to the previous one (A/B rollback). The rollout stopped at this "
            "node; the nodes after it were not touched. Find why the new version did not boot (its console, "
            "`talosctl dmesg`), fix it, then run `pulumi up` again.")
    readiness.wait_ready(gate, _target(node), boot_before=before, timeout=node.timeout, started=started, log=ctx.log)
    if node.drain:
        cordons.uncordon(gate, node.address, reason=CORDON_REASON, log=ctx.log)
    ctx.log(f"{node.address}: runs Talos {running}")
    return running

