"""A zone's config change rolled by what it does (issue 28). No Pulumi: providers/config_rollout.py
calls it.

Each configured node is asked first (ApplyConfiguration dry run, auto mode) what the change
would do. A change Talos applies live needs nothing here: every node's ConfigApply sends it at
once, in no-reboot mode. A change that needs a reboot rolls: control planes one at a time,
behind the etcd gate, then each worker pool `max_unavailable` nodes at a time. Each node is
cordoned and drained first, gets its config (it reboots), passes the readiness gate
(readiness.py) and is uncordoned; only then does the next wave start.

Resumable by asking again: a node that already runs its new config answers "No changes." and
is skipped, and our cordon left by a killed run is undone once that node is ready.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable

from kontinuum.errors import KontinuumError
from kontinuum.lifecycle import cordons, etcd_health, readiness
from kontinuum.talos import lifecycle
from kontinuum.talos.errors import NodeUnreachableError, TalosTimeoutError, TlsTrustError

CORDON_REASON = "config-rollout"
REBOOT, LIVE, NONE, NEW = "reboot", "live", "none", "new"
NO_CHANGES = "No changes."  # the end of a dry run's summary when the config is the same


@dataclass(frozen=True)
class Node:
    name: str  # its Instance
    address: str
    role: str  # controlplane | worker
    pool: str

    @property
    def control_plane(self) -> bool:
        return self.role == "controlplane"


@dataclass(frozen=True)
class Step:
    node: Node
    action: str  # REBOOT, LIVE, NONE or NEW (still in maintenance mode: its ConfigApply installs it)
    detail: str = ""


@dataclass(frozen=True)
class Settings:
    max_unavailable: int
    drain: bool  # workers
    drain_control_planes: bool
    timeout: float  # each node: drain, apply, reboot, ready again
    health_timeout: float  # each etcd gate
    drain_timeout: float


@dataclass(frozen=True)
class Context:
    gate: readiness.Gate
    log: Callable[[str], None]


class NodeUnansweredError(KontinuumError):
    pass


def ask(gate: readiness.Gate, node: Node, config: str, timeout: float) -> Step:
    """What applying `config` to `node` would do, by its own dry run."""
    client = gate.client_for(node.address)
    try:
        result = client.apply_config(config, mode="auto", dry_run=True, timeout=timeout)
    except TlsTrustError:
        return Step(node, NEW, "not configured with this cluster's identity yet")
    except (NodeUnreachableError, TalosTimeoutError) as e:
        raise NodeUnansweredError(
            f"{node.name} ({node.address}) did not answer the dry run of its new config ({e.problem}). Nothing was "
            "changed on any node. Bring it back; if the machine is gone for good, mark it `lost: true` in "
            "talosAddresses and run `pulumi up` again.") from None
    if result.details.rstrip().endswith(NO_CHANGES):
        return Step(node, NONE)
    return Step(node, REBOOT if result.mode == "reboot" else LIVE)


def plan(gate: readiness.Gate, nodes: Iterable[Node], configs: dict[str, str], timeout: float) -> list[Step]:
    """Every node's step, in rollout order: control planes as listed, then each pool's workers."""
    ordered = sorted(nodes, key=lambda n: not n.control_plane)  # stable: keeps the listed order
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(ordered)))) as pool:
        return list(pool.map(lambda n: ask(gate, n, configs[n.pool], timeout), ordered))


def waves(steps: list[Step], max_unavailable: int) -> list[list[Step]]:
    """The reboots in the order they run: each control plane alone, then each worker pool in
    batches of at most max_unavailable."""
    out: list[list[Step]] = []
    reboots = [s for s in steps if s.action == REBOOT]
    out += [[s] for s in reboots if s.node.control_plane]
    pools: dict[str, list[Step]] = {}
    for s in reboots:
        if not s.node.control_plane:
            pools.setdefault(s.node.pool, []).append(s)
    for members in pools.values():
        out += [members[i:i + max_unavailable] for i in range(0, len(members), max_unavailable)]
    return out


def describe(steps: list[Step], max_unavailable: int) -> list[str]:
    """The plan as a reviewer reads it in a preview: which nodes reboot, in which order."""
    lines = [f"wave {i}: reboot {', '.join(f'{s.node.name} ({s.node.address})' for s in wave)}"
             for i, wave in enumerate(waves(steps, max_unavailable), 1)]
    live = [s.node.name for s in steps if s.action == LIVE]
    if live:
        lines.append(f"live, no reboot: {', '.join(live)}")
    return lines or ["no node reboots"]


def _target(node: Node) -> readiness.Target:
    return readiness.Target(node.address, node.name, node.control_plane)


def _drains(settings: Settings, node: Node) -> bool:
    return settings.drain_control_planes if node.control_plane else settings.drain


def _reboot_into(ctx: Context, settings: Settings, node: Node, config: str) -> str | None:
    """Apply the config (the node reboots); returns the boot id from before."""
    client = ctx.gate.client_for(node.address)
    before = lifecycle.boot_id(client)
    result = client.apply_config(config, mode="auto", timeout=min(settings.timeout, client.deadlines.apply_config))
    ctx.log(f"{node.address}: config applied; the node chose {result.mode}")
    return before if result.mode == "reboot" else None


def roll_wave(ctx: Context, settings: Settings, wave: list[Step], configs: dict[str, str]) -> None:
    started = time.monotonic()
    if any(s.node.control_plane for s in wave):
        etcd_health.wait_healthy(ctx.gate.client_for, list(ctx.gate.control_planes), timeout=settings.health_timeout,
                                 why=f"before rebooting control plane {wave[0].node.address}")
    cordoned: list[Node] = []
    boots: dict[Node, str | None] = {}
    try:
        for s in wave:
            if _drains(settings, s.node):
                cordoned.append(s.node)
                cordons.cordon(ctx.gate, _target(s.node), reason=CORDON_REASON, timeout=settings.drain_timeout,
                               log=ctx.log, without_api="Bring the API back, then run `pulumi up` again.")
        for s in wave:
            boots[s.node] = _reboot_into(ctx, settings, s.node, configs[s.node.pool])
    except Exception:
        for node in cordoned:  # nothing rebooted it: it must not stay cordoned
            if node not in boots:
                cordons.try_uncordon(ctx.gate, node.address, reason=CORDON_REASON, log=ctx.log)
        raise
    for node, before in boots.items():
        try:
            readiness.wait_ready(ctx.gate, _target(node), boot_before=before, timeout=settings.timeout, started=started,
                                 log=ctx.log)
        except readiness.NodeNotReadyError as e:
            kept = " Its Node stays cordoned until it is ready (the next run uncordons it)." if node in cordoned else ""
            raise readiness.NodeNotReadyError(f"{e}{kept}") from None
    for node in cordoned:
        cordons.uncordon(ctx.gate, node.address, reason=CORDON_REASON, log=ctx.log)


def roll(ctx: Context, settings: Settings, steps: list[Step], configs: dict[str, str]) -> None:
    """Run the reboots of `steps`; a node already on its config that we left cordoned is
    uncordoned once ready."""
    for s in steps:
        if s.action == NONE and _drains(settings, s.node):
            cordons.resume(ctx.gate, _target(s.node), reason=CORDON_REASON, timeout=settings.timeout, log=ctx.log)
    for i, wave in enumerate(waves(steps, settings.max_unavailable), 1):
        names = ", ".join(f"{s.node.name} ({s.node.address})" for s in wave)
        ctx.log(f"config rollout wave {i}: rebooting {names}")
        roll_wave(ctx, settings, wave, configs)
