"""Killing a real `pulumi up`/`destroy` the way a dying CI runner does, at a chosen step.

The engine runs in a session of its own; its plugins run in process groups of their own (the
engine's choice) and must die with it (tools/plugins). A kill point is the engine's start event
(--event-log) of a resource step; at that moment the engine is frozen (SIGSTOP) until its
checkpoint holds the step as a pending operation, so the kill provably lands inside the step;
a Helm release's kill waits, engine frozen and provider still running, for the release record
the install writes first. Then SIGKILL to the whole session, as CI does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lab.pulumi_cli import Stack

HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
LEFTOVER_BOUND = 5.0  # seconds a plugin may outlive a killed engine


def kind(event: dict) -> str | None:
    """The kind of resource a step works on: helm, kubernetes (objects) or dynamic:<parent>/<name
    pattern> (the name with its region-zone prefix, hashes and numbers taken out), None for others."""
    meta = event.get("metadata") or {}
    rtype, name = meta.get("type", ""), meta.get("urn", "").rsplit("::", 1)[-1]
    if rtype == HELM_RELEASE:
        return "helm"
    if rtype.startswith("kubernetes:"):
        return "kubernetes"
    if rtype.startswith("pulumi-python:dynamic"):
        types = meta.get("urn", "").split("::")[2].split("$")
        parent = types[-2].rsplit(":", 1)[-1] + "/" if len(types) > 1 else ""  # an Instance and its
        pattern = re.sub(r"[0-9a-f]{8}|\d+", "#", re.sub(r"^[a-z0-9]+-[a-z0-9]+-", "", name))  # ConfigApply
        return f"dynamic:{parent}{pattern}"
    return None


class EventLog:
    """Reads the engine's --event-log incrementally."""

    def __init__(self, path: Path):
        self.path, self.offset, self.buffer = path, 0, ""

    def new_events(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
            self.offset = f.tell()
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split("\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out


def checkpoint(stack: Stack) -> dict:
    path = stack.state_dir / "backend" / ".pulumi" / "stacks" / "kontinuum" / f"{stack.name}.json"
    try:
        return json.loads(path.read_text()).get("checkpoint", {}).get("latest") or {}
    except (OSError, ValueError):
        return {}


def pending(stack: Stack) -> list[dict]:
    return checkpoint(stack).get("pending_operations") or []


def our_processes(stack: Stack) -> list[tuple[int, str]]:
    """Processes started for this stack's runs (they carry its KONTINUUM_STATE), but not us."""
    marker = f"KONTINUUM_STATE={stack.state_dir}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            if stat.rsplit(") ", 1)[-1].split()[0] == "Z":
                continue
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append((int(entry.name), argv[:120]))
    return out


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


@dataclass
class Kill:
    kind: str
    op: str
    urn: str
    leftover_after: float  # seconds until nothing of the run was left
    leftover_at_kill: int  # processes of the run alive right after the SIGKILL (engine excluded)
    helm_status: str | None = None  # the release record's status at the kill


def start(stack: Stack, command: str, log: Path) -> subprocess.Popen:
    """The run in a session of its own; its output goes to <log>.out (a pipe would fill up)."""
    args = ("up", "--yes", "--skip-preview") if command == "up" else ("destroy", "--yes", "--skip-preview")
    with open(log.with_suffix(".out"), "w") as out:
        proc = subprocess.Popen(stack.command(*args, f"--event-log={log}"), cwd=stack.project_dir, env=stack.env(),
                                stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    proc.output = log.with_suffix(".out")
    return proc


def freeze(proc: subprocess.Popen, stack: Stack) -> list[int]:
    """SIGSTOP the engine's session and every plugin of the run (their own process groups)."""
    os.killpg(proc.pid, signal.SIGSTOP)
    plugins = []
    for pid, _ in our_processes(stack):
        try:
            if os.getpgid(pid) != proc.pid:
                os.kill(pid, signal.SIGSTOP)
                plugins.append(pid)
        except ProcessLookupError:
            pass
    return plugins


def thaw(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def finished(log: Path, urn: str) -> bool:
    """Whether the engine reported the step on `urn` done (its outputs event)."""
    needle = f'"urn":"{urn}"'
    return any("resOutputsEvent" in line and needle in line.replace(" ", "")
               for line in log.read_text().splitlines())


def freeze_until_pending(proc: subprocess.Popen, stack: Stack, urn: str, op: str, log: Path, timeout: float = 20):
    """Freeze the run (engine and plugins) at once, then let only the engine go in 20 ms slices
    until its checkpoint holds `urn` as pending: the provider cannot finish the step meanwhile.
    Returns (the pending operation, the frozen plugins), or None when the step had finished
    before the freeze (the run is thawed again)."""
    deadline = time.monotonic() + timeout
    plugins = freeze(proc, stack)
    while True:
        cp = checkpoint(stack)
        for entry in cp.get("pending_operations") or []:
            if entry["resource"]["urn"] == urn:
                return entry, plugins
        done = any(r["urn"] == urn for r in cp.get("resources") or []) == (op == "create") if op != "update" \
            else finished(log, urn)
        if done:
            thaw(plugins)
            os.killpg(proc.pid, signal.SIGCONT)
            return None
        assert time.monotonic() < deadline, f"the checkpoint never held {urn} as pending"
        os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGSTOP)
        plugins += [p for p in freeze(proc, stack) if p not in plugins]


def kill(proc: subprocess.Popen, stack: Stack) -> tuple[int, float]:
    """SIGKILL the engine's session; (processes of the run alive right after, seconds until none)."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    t0 = time.monotonic()
    first = None
    while True:
        left = our_processes(stack)
        first = len(left) if first is None else first
        if not left:
            return first, time.monotonic() - t0
        if time.monotonic() - t0 > LEFTOVER_BOUND + 25:
            raise AssertionError(f"{len(left)} processes ({rss_mb([p for p, _ in left]):.0f} MB) outlived the "
                                 f"killed run by {LEFTOVER_BOUND + 25:g} s: {left}")
        time.sleep(0.1)


def run_killed(stack: Stack, command: str, log: Path, op: str, seen: set[str], *, helm_record=None,
               timeout: float = 600) -> Kill | subprocess.Popen:
    """Run `command`; kill it in the first `op` step of a kind not in `seen`. Returns the Kill, or
    the finished process when the run ended without such a step."""
    proc, events = start(stack, command, log), EventLog(log)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            for e in events.new_events():
                pre = e.get("resourcePreEvent") or {}
                meta = pre.get("metadata") or {}
                k = kind(pre) if meta.get("op") == op else None
                if k is None or k in seen:
                    continue
                frozen = freeze_until_pending(proc, stack, meta["urn"], op, log)
                if frozen is None:
                    continue  # finished before the freeze: the next step of this kind is the kill point
                entry, plugins = frozen
                status = None
                if k == "helm" and helm_record:
                    # The engine may have been stopped between recording the pending step and
                    # sending it to the plugin: the whole run goes on, and is stopped again the
                    # moment Helm's pending record shows (Helm keeps it while it applies and waits).
                    thaw(plugins)
                    os.killpg(proc.pid, signal.SIGCONT)
                    status = helm_record(entry, lambda: freeze(proc, stack))
                at_kill, after = kill(proc, stack)
                return Kill(k, op, meta["urn"], after, at_kill, status)
            assert time.monotonic() < deadline, f"`pulumi {command}` still running after {timeout:g} s"
            time.sleep(0.01)
        proc.stdout_text = proc.output.read_text()
        return proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
