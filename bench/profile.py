"""Profiles of a run that missed its aim (`python -m bench --profile`): what dominates.

- the engine: its own `--profiling PREFIX` flag writes a Go CPU profile; `go tool pprof -top
  -cum` names where its time goes;
- the Python program: py-spy (from PyPI, installed on demand into bench/out/pytools, never into
  the project's venv) attached to the language host's program process, sampled at 50 Hz;
  threads blocked in a gRPC call to the engine count as samples too, so the summary splits
  those out;
- every process of the tree: CPU seconds by process name (bench.proctree.TreeSampler), always.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from bench import common, proctree

PYTOOLS = common.OUT / "pytools"
PY_SPY_VERSION = "0.4.3"


def py_spy() -> Path | None:
    exe = PYTOOLS / "bin" / "py-spy"
    if exe.exists():
        return exe
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target",
                        str(PYTOOLS), f"py-spy=={PY_SPY_VERSION}"], capture_output=True, text=True, timeout=300)
    return exe if r.returncode == 0 and exe.exists() else None


class ProgramSpy:
    """Attaches py-spy to the Python program (pulumi-language-python-exec) once it appears
    below `root`, and records raw collapsed stacks to `out`."""

    def __init__(self, root_pid_getter, out: Path):
        self.root = root_pid_getter
        self.out = out
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "ProgramSpy":
        exe = py_spy()
        if exe is None:
            self.error = f"py-spy {PY_SPY_VERSION} could not be installed from PyPI"
            return self
        self._exe = exe
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set() and self.proc is None:
            root = self.root()
            for pid in proctree.descendants(root) if root else []:
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if any(a.endswith(b"pulumi-language-python-exec") for a in argv):
                    self.proc = subprocess.Popen(
                        [str(self._exe), "record", "-p", str(pid), "-r", "50", "-f", "raw", "-o", str(self.out),
                         "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        env={**os.environ, "PYTHONPATH": str(PYTOOLS)})
                    break
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self.proc is not None:
            try:
                self.proc.wait(60)  # py-spy writes its file when the program exits
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def summarize_pyspy(path: Path, top: int = 8) -> str:
    if not path.exists():
        return "no py-spy samples"
    incl: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        total += int(n)
        leaf[frames[-1]] += int(n)
        for f in set(frames):
            incl[f] += int(n)
    if not total:
        return "no py-spy samples"
    blocked = sum(n for f, n in leaf.items() if "_blocking (grpc/_channel.py)" in f)
    parts = [f"{total} samples; {blocked / total:.0%} waiting in a gRPC call to the engine"]
    parts.append("self time: " + ", ".join(f"{f} {n / total:.0%}" for f, n in leaf.most_common(top)
                                           if f.strip() and "_blocking (grpc" not in f))
    interesting = [(f, n) for f, n in incl.most_common(80)
                   if any(k in f for k in ("kontinuum", "providers/", "zone.py", "talos_cluster.py", "wait_for_rpcs",
                                           "register_resource", "serialize", "log.py"))]
    parts.append("inclusive: " + ", ".join(f"{f} {n / total:.0%}" for f, n in interesting[:top]))
    return "; ".join(parts)


def summarize_engine(prefix: Path, top: int = 12) -> str:
    profiles = sorted(prefix.parent.glob(prefix.name + ".*.cpu"))
    if not profiles:
        return "no engine CPU profile written"
    binary = os.path.realpath(common.tools_bin() / "pulumi")
    r = subprocess.run(["go", "tool", "pprof", "-top", "-cum", f"-nodecount={top * 4}", binary, str(profiles[-1])],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return f"go tool pprof failed: {r.stderr.strip()[-300:]}"
    lines = r.stdout.splitlines()
    total = next((ln for ln in lines if ln.startswith("Duration:")), "")
    rows = []
    for ln in lines:
        m = re.match(r"\s*\S+\s+\S+\s+\S+\s+(\S+)\s+(\S+%)\s+(.*)$", ln)
        if not m or not any(k in m.group(3) for k in ("pulumi/pkg", "pulumi/sdk", "runtime.gcBgMarkWorker")):
            continue
        fn = m.group(3).replace("github.com/pulumi/pulumi/", "")
        rows.append(f"{fn} {m.group(2)}")
        if len(rows) >= top:
            break
    return f"{total.strip()}; cumulative: " + ", ".join(rows)
