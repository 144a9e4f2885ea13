"""Restore a zone's etcd from a backup file: Talos's documented disaster recovery (day-2 facts
§3), with every check done before anything is wiped.

1. verify: the file is ours, sealed with this zone's key, of this zone and cluster (cluster id
   and etcd CA), whole and authentic, and holds an intact etcd snapshot (size % 512 == 32,
   sha256 trailer, bbolt magic) - all without writing the plaintext anywhere;
2. survey: every control plane answers and says what its etcd is doing; a healthy etcd is
   refused unless forced. Control planes declared lost (stack config `lost: true`) are left
   out, and a machine that answers only in maintenance mode (a replacement not configured yet)
   joins at the next `pulumi up`, after the restore;
3. wipe the etcd data (EPHEMERAL) of every control plane that still holds some, back to back
   so none rejoins the old etcd, and wait until each one's etcd is Preparing;
4. EtcdRecover the snapshot to the first control plane, Bootstrap(recover_etcd) it; the others
   join by themselves; wait for Talos's health check (with lost or new machines: for etcd to be
   healthy on the control planes restored; `pulumi up` then takes out the lost machines, joins
   the new ones and runs the health check).

Each step reads the truth first, so a run killed anywhere is resumed by running it again: a
node already wiped is not wiped twice, and a finished restore shows up as a healthy etcd.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from kontinuum.backup import sealed
from kontinuum.backup.snapshot import SnapshotCheck, SnapshotInvalid
from kontinuum.backup.zone import BackupError, ZoneAccess
from kontinuum.talos import etcd_stream
from kontinuum.talos.errors import AlreadyBootstrappedError, NodeUnreachableError, TalosError, TlsTrustError
from kontinuum.talos.waits import NotYet, WaitTimeout, wait_until

PREPARING = "Preparing"
CALL_TIMEOUT = 10.0


@dataclass(frozen=True)
class Bounds:
    wipe: float = 600.0  # reset sent → the node's etcd back and Preparing
    health: float = 900.0  # recovery bootstrap → Talos's health check passes
    upload: float = etcd_stream.RECOVER_TIMEOUT


@dataclass(frozen=True)
class Verified:
    path: Path
    header: sealed.Header
    size: int
    sha256: str


def verify(path: Path, access: ZoneAccess) -> Verified:
    """Everything about the file that can be checked without touching the zone."""
    key = access.require_key()
    where = f"snapshot {path}"
    try:
        with open(path, "rb") as f:
            header, _, _ = sealed.read_header(f)
            who = access.identity()
            if header.zone != access.cluster:
                raise BackupError(f"{where} is a backup of zone {header.zone}, not of {access.cluster}; nothing was "
                                  "changed")
            if header.cluster_id_sha256 != who.cluster_id_sha256 or header.etcd_ca_sha256 != who.etcd_ca_sha256:
                what = "etcd CA" if header.cluster_id_sha256 == who.cluster_id_sha256 else "cluster id"
                raise BackupError(f"{where} is of another cluster named {header.zone} (its {what} differs from the "
                                  f"zone's: a backup of a recreated zone or of another stack); nothing was changed")
            f.seek(0)
            header, chunks = sealed.open_segments(f, key)
            check = SnapshotCheck()
            for chunk in chunks:
                check.update(chunk)
            size, digest = check.finish()
    except OSError as exc:
        raise BackupError(f"{where}: cannot read it ({exc.strerror}); nothing was changed") from None
    except (sealed.SealedFileError, SnapshotInvalid) as exc:
        raise BackupError(f"{where} is refused: {exc}; nothing was changed") from None
    return Verified(path, header, size, digest)


@dataclass(frozen=True)
class Survey:
    states: dict[str, str]  # control plane -> its etcd service: 'Running (healthy)', 'Preparing'…
    lost: tuple[str, ...] = ()  # declared lost: left out
    new: tuple[str, ...] = ()  # answering in maintenance mode: joins at the next `pulumi up`

    @property
    def partial(self) -> bool:
        return bool(self.lost or self.new)


def etcd_states(access: ZoneAccess, lost: frozenset[str] = frozenset()) -> Survey:
    """Each control plane's etcd service, those declared lost left out. Every other one must
    answer (one that does not could keep the old etcd alive), as a member or as a new machine."""
    states, problems, new = {}, [], []
    for node in access.control_planes:
        if node in lost:
            continue
        try:
            services = access.client(node).service_list(timeout=CALL_TIMEOUT)
        except TlsTrustError as exc:
            if _in_maintenance(access, node):  # a new machine: `pulumi up` configures it after the restore
                new.append(node)
            else:
                problems.append(f"{node}: {exc}")
            continue
        except TalosError as exc:
            problems.append(f"{node}: {exc}")
            continue
        etcd = next((s for s in services if s.id == "etcd"), None)
        states[node] = "absent" if etcd is None else etcd.state + (
            " (healthy)" if etcd.healthy else " (unhealthy)" if etcd.state == "Running" else "")
    if problems:
        none = "no control plane answers" if not states else "not every control plane answers"
        raise BackupError(f"zone {access.cluster}: {none}, so its etcd cannot be restored safely; nothing was "
                          "wiped:\n  " + "\n  ".join(problems) + "\nBring those machines back, or if they are gone "
                          "for good mark them `lost: true` in the stack config (README: Lost machines), and run the "
                          "restore again.")
    if not states:
        raise BackupError(f"zone {access.cluster}: no control plane that is not marked lost holds this cluster's "
                          f"config ({', '.join(new) or 'none'} answer in maintenance mode only); restore onto at least "
                          "one configured control plane. Nothing was wiped.")
    return Survey(states, tuple(sorted(n for n in access.control_planes if n in lost)), tuple(new))


def _in_maintenance(access: ZoneAccess, node: str) -> bool:
    """The node answers in maintenance mode (never configured, or reset): no etcd to keep alive."""
    from kontinuum.talos.client import TalosClient

    try:
        TalosClient.maintenance(node, port=access.talos_port).discover(timeout=CALL_TIMEOUT)
    except TalosError:
        return False
    return True


def healthy(states: dict[str, str]) -> list[str]:
    return [n for n, s in states.items() if s == "Running (healthy)"]


def plan_text(access: ZoneAccess, v: Verified, survey: Survey) -> str:
    states = survey.states
    wipe = [n for n, s in states.items() if s != PREPARING]
    done = [n for n, s in states.items() if s == PREPARING]
    first = next(iter(states))
    lines = [
        f"restore of zone {access.cluster} from {v.path}",
        f"  snapshot taken {v.header.created} from {v.header.node}, {v.size} bytes, etcd sha256 {v.sha256[:16]}…",
        "  etcd now: " + ", ".join(f"{n} {s}" for n, s in states.items()),
        "  1. wipe etcd data (reset, graceful=false, reboot, system partition EPHEMERAL) of: "
        + (", ".join(wipe) or "none") + (f" (already wiped: {', '.join(done)})" if done else ""),
        "  2. wait until every control plane's etcd is Preparing",
        f"  3. upload the snapshot to {first} (EtcdRecover) and bootstrap it with recover_etcd",
        "  4. wait for the other control planes to rejoin and Talos's health check to pass" if not survey.partial
        else "  4. wait for etcd to be healthy on " + ", ".join(states),
    ]
    if survey.lost:
        lines.append("  left out, declared lost: " + ", ".join(survey.lost))
    if survey.new:
        lines.append("  new, joining at the next `pulumi up`: " + ", ".join(survey.new))
    return "\n".join(lines)


def _plaintext(path: Path, key: str) -> Iterator[bytes]:
    """The snapshot again, checked again as it streams (the file may have changed since verify)."""
    with open(path, "rb") as f:
        _, chunks = sealed.open_segments(f, key)
        check = SnapshotCheck()
        for chunk in chunks:
            check.update(chunk)
            yield chunk
        check.finish()


def restore(access: ZoneAccess, path: Path, *, force: bool = False, bounds: Bounds = Bounds(),
            log: Callable[[str], None] = print, dry_run: bool = False, lost: frozenset[str] = frozenset()) -> Verified:
    """lost: control-plane addresses the stack config declares lost (left out)."""
    v = verify(path, access)
    survey = etcd_states(access, lost)
    states = survey.states
    alive = healthy(states)
    if dry_run:
        log(plan_text(access, v, survey) + ("\n  (etcd is healthy: the restore needs --force)" if alive and not force
                                            else ""))
        return v
    if alive and not force:
        raise BackupError(f"zone {access.cluster}: etcd is healthy on {', '.join(alive)}; a restore would throw away "
                          "everything written since the snapshot, so it is refused. Pass --force to restore anyway "
                          "(an interrupted restore that got as far as its bootstrap has already finished).")
    log(plan_text(access, v, survey))
    wipe = [n for n, s in states.items() if s != PREPARING]
    for node in wipe:  # back to back: none may come back and rejoin the etcd being wiped
        log(f"restore {access.cluster}: wiping the etcd data of {node}")
        access.client(node).reset(graceful=False, reboot=True, system_partitions=["EPHEMERAL"],
                                  timeout=CALL_TIMEOUT)
    for node in states:
        _wait_preparing(access, node, bounds.wipe)
    first = next(iter(states))
    key = access.require_key()
    log(f"restore {access.cluster}: uploading the snapshot to {first}")
    try:
        _upload(access, first, lambda: _plaintext(path, key), bounds, log)
    except (sealed.SealedFileError, SnapshotInvalid) as exc:
        raise BackupError(f"snapshot {path} changed while it was uploaded ({exc}); the control planes are wiped "
                          "and wait for a recovery: run the restore again with an intact file") from None
    log(f"restore {access.cluster}: bootstrapping etcd on {first} from the snapshot")
    try:
        access.client(first).bootstrap(recover_etcd=True, timeout=CALL_TIMEOUT * 3)
    except AlreadyBootstrappedError as exc:
        raise BackupError(f"zone {access.cluster}: {first} refuses the recovery bootstrap ({exc.problem}); its etcd "
                          "holds data again: check `etcd` on it, then run the restore again (with --force if its "
                          "etcd is healthy)") from None
    if survey.partial:
        _wait_etcd(access, list(states), bounds.health)
        log(f"restore {access.cluster}: done; etcd is back at the snapshot of {v.header.created} on "
            f"{', '.join(states)}. Now run `pulumi up`: it takes out the lost machines' Nodes, joins "
            f"{', '.join(survey.new) or 'the replacements'} and runs the health check")
        return v
    log(f"restore {access.cluster}: waiting for the other control planes and the health check")
    access.client(first).health_check(list(states), access.workers, wait_timeout=bounds.health)
    log(f"restore {access.cluster}: done; etcd is back at the snapshot of {v.header.created}")
    return v


def _upload(access: ZoneAccess, node: str, chunks: Callable[[], Iterator[bytes]], bounds: Bounds,
            log: Callable[[str], None]) -> None:
    """EtcdRecover, each try with the file read afresh. A node that does not take the connection
    (rebooting again, a network blip) gets the wipe's bound to come back: a refused upload sent
    nothing, and a repeated one only replaces the uploaded file (Bootstrap has not run)."""
    def attempt(left: float) -> None:
        try:
            etcd_stream.recover(access.client(node), chunks(), timeout=bounds.upload)
        except NodeUnreachableError as exc:
            log(f"restore {access.cluster}: {node} does not take the upload yet ({exc.problem}); trying again")
            raise NotYet(f"{node}: {exc.problem}") from None

    try:
        wait_until(f"zone {access.cluster}: {node} taking the snapshot", attempt, timeout=bounds.wipe,
                   remedy="check the node; run the restore again once it is back (wiped nodes are not wiped again)")
    except WaitTimeout as exc:
        raise BackupError(str(exc)) from None


def _wait_etcd(access: ZoneAccess, control_planes: list[str], bound: float) -> None:
    from kontinuum.lifecycle import etcd_health

    try:
        etcd_health.wait_healthy(access.client, control_planes, timeout=bound, why="after the restore")
    except etcd_health.EtcdUnhealthyError as exc:
        raise BackupError(str(exc)) from None


def _wait_preparing(access: ZoneAccess, node: str, bound: float) -> None:
    def probe(left: float) -> None:
        try:
            services = access.client(node).service_list(timeout=min(CALL_TIMEOUT, left))
        except TalosError as exc:
            raise NotYet(f"{node}: {exc.problem}") from None
        state = next((s.state for s in services if s.id == "etcd"), "absent")
        if state != PREPARING:
            raise NotYet(f"{node}: etcd is {state}")

    try:
        wait_until(f"zone {access.cluster}: etcd of {node} wiped and Preparing", probe, timeout=bound,
                   remedy="check the node; run the restore again once it is back (wiped nodes are not wiped again)")
    except WaitTimeout as exc:
        raise BackupError(str(exc)) from None
