"""Process trees read from /proc: who is below a process, what it is called, its CPU seconds,
and a sampler of a tree's summed RSS/PSS over a run.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from bench.common import mib

PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_EVERY = 0.1  # seconds between /proc samples of a process tree
CLK_TCK = os.sysconf("SC_CLK_TCK")


def stat(pid: int) -> tuple[str, int, float] | None:
    """(comm, ppid, CPU seconds user+system) of a process."""
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    r = s.rindex(")")
    fields = s[r + 2:].split()
    return s[s.index("(") + 1:r], int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _cmdname(pid: int, comm: str) -> str:
    """A readable name: `python -m pulumi.dynamic` rather than `python3.11`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return comm
    if comm.startswith("python") and "-m" in argv:
        i = argv.index("-m")
        if i + 1 < len(argv):
            return f"python -m {argv[i + 1]}"
    if comm.startswith("python") and any(a.endswith("__main__.py") for a in argv):
        return "python program"
    if comm.startswith("python") and len(argv) > 1:
        script = next((a for a in argv[1:] if not a.startswith("-")), "")
        if script:
            return f"python {Path(script).name}"
    if argv and argv[0] and not comm.startswith("python"):
        return Path(argv[0]).name  # comm is cut at 15 characters
    return comm


def descendants(root: int) -> list[int]:
    """root and every live process below it (by parent links, read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = stat(int(entry.name))
            if st:
                children.setdefault(st[1], []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class TreeSampler:
    """Samples the summed RSS of a process tree every SAMPLE_EVERY s from /proc, and its summed
    PSS every PSS_EVERY samples (smaps_rollup is costlier to read).

    The RSS sum counts shared pages (a binary's text, shared libraries) once per process, so
    it is an upper bound of what the tree holds; PSS splits shared pages among their users.
    A spike shorter than the sampling period can be missed. CPU seconds per process are
    taken from its last sample, so a process's last <100 ms are missing."""

    PSS_EVERY = 10

    def __init__(self, root: int | None = None, roots=None, every: float = SAMPLE_EVERY, pss: bool = True):
        self._roots = roots or (lambda: [root])
        self.every = every
        self.pss = pss
        self.peak = 0
        self.peak_pss = 0
        self.peak_breakdown: dict[str, int] = {}
        self.peak_counts: dict[str, int] = {}
        self.peak_procs = 0
        self.samples = 0
        self.last = 0
        self.cpu: dict[int, tuple[str, float]] = {}  # pid -> (name, CPU seconds at its last sample)
        self.names: dict[int, str] = {}
        self._comm: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> "TreeSampler":
        self._thread.start()
        return self

    def sample(self) -> int:
        pids: set[int] = set()
        for r in self._roots():
            if r:
                pids.update(descendants(r))
        by_name: dict[str, int] = {}
        count: dict[str, int] = {}
        total = 0
        pss = 0
        with_pss = self.pss and self.samples % self.PSS_EVERY == 0
        for pid in pids:
            rss = _rss(pid)
            if not rss:
                continue
            st = stat(pid)
            comm = st[0] if st else "?"
            if self._comm.get(pid) != comm:  # new, or exec'd into another program (tools/pulumi → pulumi)
                self._comm[pid] = comm
                self.names[pid] = _cmdname(pid, comm)
            name = self.names[pid]
            if st:
                self.cpu[pid] = (name, st[2])
            by_name[name] = by_name.get(name, 0) + rss
            count[name] = count.get(name, 0) + 1
            total += rss
            if with_pss:
                pss += _pss(pid)
        self.samples += 1
        self.last = total
        self.peak_pss = max(self.peak_pss, pss)
        if total > self.peak:
            self.peak, self.peak_breakdown, self.peak_procs = total, by_name, len(pids)
            self.peak_counts = count
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def stop(self) -> "TreeSampler":
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        return self

    def breakdown(self, top: int = 6) -> str:
        items = sorted(self.peak_breakdown.items(), key=lambda kv: -kv[1])
        shown = [f"{name} ×{self.peak_counts.get(name, 1)} {mib(v):.0f}" for name, v in items[:top]]
        if len(items) > top:
            shown.append(f"other {mib(sum(v for _, v in items[top:])):.0f}")
        return ", ".join(shown) + " MiB"

    def cpu_by_name(self) -> dict[str, tuple[int, float]]:
        """name -> (processes, CPU seconds)."""
        out: dict[str, tuple[int, float]] = {}
        for name, secs in self.cpu.values():
            n, total = out.get(name, (0, 0.0))
            out[name] = (n + 1, total + secs)
        return out

    def cpu_breakdown(self, top: int = 6) -> str:
        items = sorted(self.cpu_by_name().items(), key=lambda kv: -kv[1][1])
        return ", ".join(f"{name} ×{n} {secs:.1f} s" for name, (n, secs) in items[:top])


def kill_tree(root: int) -> None:
    """SIGKILL a process this benchmark started, and everything below it (by pid)."""
    for pid in reversed(descendants(root)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
