"""Linux process accounting (acct(5), version 3 records): the CPU of every process that ended
while accounting was on, by kind, with each process's parent found from pid, ppid and start time.

Turned on with `accton FILE` (Debian's acct package, root only); bench/suite.py uses it to split
the test suite's CPU by process kind, which no other reading can do once the processes are gone.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

RECORD = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")  # struct acct_v3, 64 bytes
AHZ = 100.0  # comp_t ticks per second
VERSION = 3


def comp_t(value: int) -> float:
    """A comp_t (13-bit mantissa, 3-bit base-8 exponent) in ticks."""
    return float((value & 0x1FFF) << (3 * (value >> 13)))


@dataclass
class Process:
    pid: int
    ppid: int
    start: float  # unix seconds
    wall: float
    cpu: float  # user + system seconds
    comm: str
    parent: "Process | None" = None


def read(path: Path) -> list[Process]:
    data = path.read_bytes()
    out = []
    for offset in range(0, len(data) - RECORD.size + 1, RECORD.size):
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, btime, etime, utime, stime, *_rest,
         comm) = RECORD.unpack_from(data, offset)
        if version & 0x7F != VERSION:
            continue
        out.append(Process(pid, ppid, float(btime), etime / AHZ, (comp_t(utime) + comp_t(stime)) / AHZ,
                           comm.split(b"\0", 1)[0].decode(errors="replace")))
    _link(out)
    return out


def _link(procs: list[Process]) -> None:
    """Each process's parent: the process of its ppid that was alive when it started."""
    by_pid: dict[int, list[Process]] = {}
    for p in procs:
        by_pid.setdefault(p.pid, []).append(p)
    for p in procs:
        for candidate in by_pid.get(p.ppid, ()):
            if candidate.start <= p.start + 1 and p.start <= candidate.start + candidate.wall + 1:
                p.parent = candidate
                break


def ancestors(p: Process) -> list[str]:
    names, seen = [], 0
    while p.parent is not None and seen < 64:
        p, seen = p.parent, seen + 1
        names.append(p.comm)
    return names


def kind(p: Process) -> str:
    """What a process was, in the terms of the suite's figures."""
    c, up = p.comm, ancestors(p)
    if c == "pulumi":
        return "engine"
    if c.startswith("pulumi-language"):
        return "language host"
    if c.startswith("pulumi-resource"):
        return "kubernetes plugin"
    if c.startswith("python"):
        if up[:1] == ["pulumi"]:
            return "dynamic-provider host"
        if up[:1] and up[0].startswith("pulumi-language"):
            return "program"
        return "python (tests, lab supervisors, CLIs)"
    if c in ("etcd", "kube-apiserver", "kube-controller", "kube-scheduler", "kwok", "etcdutl"):
        return "control planes (etcd, apiserver, controllers, kwok)"
    if c.startswith(("cert-manager", "controller", "webhook", "pebble", "flux-operator", "weed", "knotd")):
        return "upstream controllers and servers"
    if c in ("go", "compile", "link", "asm", "cgo", "kontinuum-talos"):
        return "Go builds and helpers"
    return "other (" + c + ")" if c in ("bash", "sh", "git", "ssh", "sshd") else "other"
