"""What a control plane's etcd service shows (ServiceList, and the health check's "etcd to be
healthy"), from the node's standing in its cluster's etcd (cluster.ClusterRegistry.etcd_standing).

- "member": Running; healthy while the cluster's etcd has quorum (bootstrapped).
- "none": no etcd data yet, waiting for a bootstrap or to join: Preparing.
- "removed": its member was removed (EtcdRemoveMemberByID) while its data directory survived.
  Talos starts etcd on that data; etcd learns it was removed and exits, and Talos restarts it
  forever (failure-facts §3). Between restarts the service waits, its last event the runner's
  error with etcd's last log lines: "the member has been permanently removed from the cluster".
  Only a wipe of EPHEMERAL (a reset) ends it.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

MEMBER, NONE, REMOVED = "member", "none", "removed"
REMOVED_ERROR = "the member has been permanently removed from the cluster"


@dataclass(frozen=True)
class EtcdService:
    state: str  # Talos service state: Preparing, Running, Waiting
    healthy: bool
    events: tuple[tuple[str, str], ...]  # (state, message), oldest first; the lab keeps the last only

    @property
    def last(self) -> tuple[str, str]:
        return self.events[-1]


def _etcd_exit_log(at: dt.datetime) -> str:
    """etcd's last two log lines when it finds itself removed (its JSON logger, as etcd 3.6.5
    was seen to write them)."""
    ts = at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lines = [
        {"level": "warn", "ts": ts, "caller": "etcdserver/server.go:860", "msg": "server error", "error": REMOVED_ERROR},
        {"level": "warn", "ts": ts, "caller": "etcdserver/server.go:861", "msg": "data-dir used by this member must be removed"},
    ]
    return "\n".join(json.dumps(line, separators=(",", ":")) for line in lines)


def service(standing: str, *, bootstrapped: bool, now: dt.datetime | None = None) -> EtcdService:
    if standing == MEMBER:
        return EtcdService("Running", bootstrapped, (("Running", "Service running"),))
    if standing == REMOVED:
        # Talos's restart runner wrapping its containerd runner (the task error quotes the
        # task's last log lines, Go %q: json.dumps escapes ASCII text the same way).
        last_log = json.dumps(_etcd_exit_log(now or dt.datetime.now(dt.timezone.utc)))
        failed = f'task "etcd" failed: exit code 1 (last log {last_log})'
        return EtcdService("Waiting", False, (
            ("Waiting", f"Error running Containerd(etcd), going to restart forever: {failed}"),))
    return EtcdService("Preparing", False, (("Preparing", "Service preparing"),))


def health_problem(standing: str, *, bootstrapped: bool) -> str | None:
    """What Talos's etcd service-health assertion says of a reachable control plane, or None.
    A control plane with no etcd data yet (Preparing) is left to the membership check."""
    if standing != REMOVED:
        return None
    state, message = service(standing, bootstrapped=bootstrapped).last
    return f'service "etcd" not in expected state "Running": current state [{state}] {message}'
