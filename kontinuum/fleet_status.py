"""What `python -m kontinuum status` says about a zone, and the exit code an alerting job reads
(issue 30). Pure: status_probe.py gathers the observations, this module judges and renders.

Levels, highest wins (for the zone, the stack and the exit code): 0 fine; 1 warning (a version
other than configured, a credential within its renewal window, no or an old backup, or one
that failed its verification); 2 unhealthy
(a node or the API down, a Node not Ready, etcd unhealthy, a credential expired); 3 unreachable
(no node of the zone answers).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field

FINE, WARNING, UNHEALTHY, UNREACHABLE = 0, 1, 2, 3
LEVELS = {FINE: "fine", WARNING: "warning", UNHEALTHY: "unhealthy", UNREACHABLE: "unreachable"}


@dataclass(frozen=True)
class Finding:
    level: int
    text: str


@dataclass
class Observation:
    """What the probe saw of one zone; None where it could not look."""

    cluster: str
    configured_talos: str | None = None
    configured_kubernetes: str | None = None
    talos: dict[str, str | None] = field(default_factory=dict)  # node -> running version (None: no answer)
    etcd_problem: str | None = None
    api_problem: str | None = None  # the Kubernetes API did not answer
    nodes: dict[str, tuple[bool, str]] = field(default_factory=dict)  # Node -> (Ready, kubelet version)
    expiries: dict[str, dt.datetime] = field(default_factory=dict)  # credential -> notAfter
    backup_at: dt.datetime | None = None
    backup_path: str | None = None
    backup_verified: bool | None = None  # the newest backup was verified to restore
    backup_failed: bool = False  # the newest backup's verification failed
    renew_before_days: float | None = None  # the zone's certificates.renewBefore (None: unknown)
    backup_problem: str | None = None  # the destination could not be listed
    verified_path: str | None = None  # the newest backup verified to restore
    verified_at: dt.datetime | None = None  # when that one was taken
    verified_checked_at: dt.datetime | None = None  # when it was verified


@dataclass
class ZoneStatus:
    cluster: str
    level: int
    findings: list[Finding]
    observation: Observation

    def to_json(self) -> dict:
        out = asdict(self)
        out["state"] = LEVELS[self.level]
        for k, v in list(out["observation"]["expiries"].items()):
            out["observation"]["expiries"][k] = v.isoformat()
        for name in ("backup_at", "verified_at", "verified_checked_at"):
            if getattr(self.observation, name):
                out["observation"][name] = getattr(self.observation, name).isoformat()
        return out


def _v(version: str | None) -> str:
    return (version or "").lstrip("v")


def other_versions(o: Observation) -> list[Finding]:
    """A node running another Talos or kubelet version than the config says (a warning here; the
    rollout's gate waits for it)."""
    found = []
    for node, version in sorted(o.talos.items()):
        if version and o.configured_talos and _v(version) != _v(o.configured_talos):
            found.append(Finding(WARNING, f"{node} runs Talos {version}, the config says {o.configured_talos}"))
    for node, (_, kubelet) in sorted(o.nodes.items()):
        if o.configured_kubernetes and kubelet and _v(kubelet) != _v(o.configured_kubernetes):
            found.append(Finding(WARNING, f"Node {node} runs kubelet {kubelet}, the config says "
                                          f"{o.configured_kubernetes}"))
    return found


def judge(o: Observation, *, now: dt.datetime, renew_before: dt.timedelta, backup_max_age: dt.timedelta) -> ZoneStatus:
    found: list[Finding] = []
    silent = sorted(n for n, v in o.talos.items() if v is None)
    if o.talos and len(silent) == len(o.talos):
        found.append(Finding(UNREACHABLE, f"no node answers the Talos API ({', '.join(silent)})"))
    elif silent:
        found.append(Finding(UNHEALTHY, f"node(s) {', '.join(silent)} do not answer the Talos API"))
    if o.etcd_problem:
        found.append(Finding(UNHEALTHY, f"etcd: {o.etcd_problem}"))
    if o.api_problem:
        found.append(Finding(UNHEALTHY, f"the Kubernetes API does not answer ({o.api_problem})"))
    for node, (ready, _) in sorted(o.nodes.items()):
        if not ready:
            found.append(Finding(UNHEALTHY, f"Node {node} is not Ready"))
    found += other_versions(o)
    for name, when in sorted(o.expiries.items(), key=lambda kv: kv[1]):
        if when <= now:
            found.append(Finding(UNHEALTHY, f"{name} expired on {when:%Y-%m-%d %H:%M} UTC"))
        elif when - renew_before <= now:
            found.append(Finding(WARNING, f"{name} expires on {when:%Y-%m-%d} (within {renew_before.days} d): "
                                          "`pulumi up` renews what the stack issues"))
    if o.backup_problem:
        found.append(Finding(WARNING, f"the backups cannot be listed: {o.backup_problem}"))
    elif o.backup_at is None:
        found.append(Finding(WARNING, "no backup of this zone was found"))
    elif now - o.backup_at > backup_max_age:
        found.append(Finding(WARNING, f"the newest backup is {_age(now - o.backup_at)} old ({o.backup_path})"))
    if o.backup_failed:
        found.append(Finding(WARNING, f"the newest backup failed its verification ({o.backup_path}): see its "
                                      "`.verified.json`, take a new one (`python -m kontinuum backup --verify`)"))
    level = max((f.level for f in found), default=FINE)
    return ZoneStatus(o.cluster, level, found, o)


def _age(delta: dt.timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours:.0f} h" if hours < 72 else f"{hours / 24:.0f} d"


def backup_text(o: Observation, now: dt.datetime) -> str:
    """"5 h old, verified", or "5 h old; newest verified 30 h old", "none"."""
    if o.backup_at is None:
        return "unreadable" if o.backup_problem else "none"
    text = _age(now - o.backup_at) + " old"
    if o.backup_verified:
        return text + ", verified"
    if o.verified_at is not None:
        return f"{text}; newest verified {_age(now - o.verified_at)} old"
    return text + ", none verified"


def next_expiry(o: Observation) -> str:
    if not o.expiries:
        return "?"
    name, when = min(o.expiries.items(), key=lambda kv: kv[1])
    return f"{name} {when:%Y-%m-%d}"


def markdown(stack: str, region: str | None, zones: list[ZoneStatus], *, now: dt.datetime, error: str | None = None) -> str:
    level = max((z.level for z in zones), default=UNREACHABLE if error else FINE)
    lines = [f"### Region `{region or '?'}` (stack `{stack}`): {LEVELS[level]}"]
    if error:
        return "\n".join([*lines, "", f"```\n{error}\n```", ""])
    lines += ["", "| zone | state | Talos | Kubernetes | Nodes Ready | next expiry | newest backup |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for z in zones:
        o = z.observation
        talos = ", ".join(sorted({v for v in o.talos.values() if v})) or "?"
        kubelets = ", ".join(sorted({k for _, k in o.nodes.values() if k})) or "?"
        ready = f"{sum(r for r, _ in o.nodes.values())}/{len(o.nodes)}" if o.nodes else "?"
        backup = backup_text(o, now)
        lines.append(f"| `{z.cluster}` | {LEVELS[z.level]} | {talos} | {kubelets} | {ready} | {next_expiry(o)} | "
                     f"{backup} |")
    for z in zones:
        lines += [f"- `{z.cluster}` {LEVELS[f.level]}: {f.text}" for f in z.findings]
    return "\n".join(lines) + "\n"
