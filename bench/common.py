"""What every benchmark shares: machine facts, statistics, process-tree sampling, timed
`pulumi` runs with a live event log, and throwaway projects.

Benchmarks print figures; they are not tests. Nothing here asserts an aim: a section says
where a figure stands against it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lab.pulumi_cli import WRAPPER, Stack

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"  # gitignored: stacks, state, event logs, lab state of the runs
PASSPHRASE = "kontinuum-bench"  # throwaway stacks only
PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_EVERY = 0.1  # seconds between /proc samples of a process tree
EVENT_POLL = 0.02  # seconds between reads of a growing event log


# -- machine and versions ----------------------------------------------------------------------


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def machine_facts() -> dict[str, str]:
    mem = "?"
    model = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": str(os.cpu_count()),
        "memory": mem,
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "load average at start (1/5/15 min)": loadavg(),
    }


def tool_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (ROOT / "tools" / "versions.env").read_text().splitlines():
        m = re.match(r"^([A-Z_]+)=(\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[f"pip {name}"] = version
    return out


def tools_bin() -> Path:
    return Path(subprocess.run([str(ROOT / "tools" / "install.sh"), "--print-bin"], capture_output=True, text=True,
                               check=True).stdout.strip())


def missing_tools(*names: str) -> list[str]:
    b = tools_bin()
    return [n for n in names if not (b / n).exists()]


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# -- statistics ----------------------------------------------------------------------------------


@dataclass
class Series:
    """N measurements of one figure."""

    values: list[float] = field(default_factory=list)

    def add(self, v: float) -> None:
        self.values.append(v)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def fmt(self, unit: str = "s", digits: int = 1) -> str:
        if not self.values:
            return "—"
        if len(self.values) == 1:
            return f"{self.values[0]:.{digits}f} {unit} (1 run)"
        lo, hi = min(self.values), max(self.values)
        return f"{self.median:.{digits}f} {unit} (min {lo:.{digits}f}, max {hi:.{digits}f}, n={len(self.values)})"


class Budget:
    """Runs up to `n`, the first always; a further one only if, at the average pace so far, it
    would end within `seconds` of the first's start. `stopped` says after how many it stopped."""

    def __init__(self, n: int, seconds: float):
        self.n, self.seconds = n, seconds
        self.stopped: int | None = None

    def __iter__(self):
        t0 = time.monotonic()
        for i in range(self.n):
            spent = time.monotonic() - t0
            if i and spent + spent / i > self.seconds:
                self.stopped = i
                return
            yield i

    def note(self, flag: str) -> str | None:
        if self.stopped is None:
            return None
        return (f"Runs stopped after {self.stopped} of {self.n}: another would pass the {self.seconds:.0f} s "
                f"budget ({flag}).")


def mib(n_bytes: float) -> float:
    return n_bytes / 1024 / 1024


# -- process trees -------------------------------------------------------------------------------


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_full(pid: int) -> tuple[str, int, float] | None:
    """(comm, ppid, CPU seconds user+system) of a process."""
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    r = s.rindex(")")
    fields = s[r + 2:].split()
    return s[s.index("(") + 1:r], int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def _stat(pid: int) -> tuple[str, int] | None:
    """(comm, ppid) of a process."""
    st = _stat_full(pid)
    return (st[0], st[1]) if st else None


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
            st = _stat(int(entry.name))
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
            st = _stat_full(pid)
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


# -- event log -----------------------------------------------------------------------------------


@dataclass
class Event:
    t: float  # wall clock when we read it (time.time()), EVENT_POLL resolution
    engine_ts: int  # the engine's own stamp: whole seconds
    kind: str
    data: dict


class EventTail:
    """Follows `pulumi --event-log FILE` while the engine writes it (one JSON object per
    line, written unbuffered) and stamps each event when it appears: the engine's own
    timestamps have whole-second resolution."""

    def __init__(self, path: Path):
        self.path = path
        self.events: list[Event] = []
        self._buf = b""
        self._pos = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-tail", daemon=True)

    def start(self) -> "EventTail":
        self._thread.start()
        return self

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except FileNotFoundError:
            return
        if not chunk:
            return
        t = time.time()
        self._pos += len(chunk)
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            kind = next((k for k in doc if k.endswith("Event")), "?")
            self.events.append(Event(t, int(doc.get("timestamp") or 0), kind, doc.get(kind) or {}))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read()
            self._stop.wait(EVENT_POLL)

    def stop(self) -> list[Event]:
        self._stop.set()
        self._thread.join(5)
        self._read()
        return self.events


# -- timed pulumi runs ---------------------------------------------------------------------------


@dataclass
class Run:
    args: list[str]
    returncode: int
    wall: float
    peak_rss: int  # summed over the process tree (sampled)
    peak_pss: int  # summed PSS over the tree (sampled every second)
    breakdown: str
    cpu_breakdown: str  # CPU seconds by process name, from /proc samples
    peak_procs: int
    maxrss_single: int  # wait4: the largest single process of the tree that was reaped
    cpu: float  # user+system seconds of the tree (processes reaped inside it)
    stdout: str
    stderr: str
    events: list[Event]
    started: float  # time.time() at start
    profile: str = ""  # with `profile=`: what dominated, engine and program


    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, n: int = 30) -> str:
        text = (self.stdout + "\n" + self.stderr).strip().splitlines()
        return "\n".join(text[-n:])


def bare_env(stack: Stack) -> dict[str, str]:
    """The environment of the bare pinned engine on `stack`: what tools/pulumi sets for the engine
    (state, backend, no update check or plugin downloads, the venv's Python), none of our own
    parts (launchers, plugin entries, recover): the language host is the tool directory's."""
    bin_dir = tools_bin()
    env = stack.env()
    env.update(PATH=f"{bin_dir}:{ROOT / 'venv' / 'bin'}:{env['PATH']}",
               PULUMI_HOME=str(stack.state_dir / "bare-pulumi-home"),
               PULUMI_PYTHON_CMD=str(ROOT / "venv" / "bin" / "python"),
               PULUMI_SKIP_UPDATE_CHECK="true", PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true")
    return env


def timed_pulumi(stack: Stack, *args: str, timeout: float, event_log: Path | None = None,
                 extra_env: dict[str, str] | None = None, profile: Path | None = None,
                 sample_every: float = SAMPLE_EVERY, bare: bool = False) -> Run:
    """Run the pinned engine through tools/pulumi in its own session, sample its tree's RSS,
    follow its event log, and take wall and rusage figures. Kills the tree on timeout.
    With `profile` (a directory), also profile the engine and the Python program there.
    Sampling reads /proc of every process; where the tree's memory is not the figure, a longer
    `sample_every` keeps the bench's own CPU off the machine it measures. With `bare`, the
    pinned engine itself runs, without tools/pulumi (bare_env)."""
    argv = [str(tools_bin() / "pulumi") if bare else str(WRAPPER), *args, "--non-interactive"]
    if profile is not None:
        shutil.rmtree(profile, ignore_errors=True)
        profile.mkdir(parents=True)
        argv += ["--profiling", str(profile / "engine")]
    if args and args[0] not in ("stack", "config"):
        argv += ["--stack", stack.name]
    tail = None
    if event_log is not None:
        event_log.unlink(missing_ok=True)
        argv += ["--event-log", str(event_log)]
        tail = EventTail(event_log).start()
    env = bare_env(stack) if bare else stack.env()
    if event_log is not None:
        env["PULUMI_DEBUG_COMMANDS"] = "true"  # `--event-log` exists only with debug commands on
    env.update(extra_env or {})
    out_path = stack.state_dir / "last.stdout"
    err_path = stack.state_dir / "last.stderr"
    stack.state_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    t0 = time.monotonic()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(argv, cwd=stack.project_dir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True)
        sampler = TreeSampler(proc.pid, every=sample_every, pss=sample_every == SAMPLE_EVERY).start()
        spy = None
        if profile is not None:
            from bench.profile import ProgramSpy
            spy = ProgramSpy(lambda: proc.pid, profile / "program.txt").start()
        deadline = t0 + timeout
        status = rusage = None
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                kill_tree(proc.pid)
                _, status, rusage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.stop()
    summary = ""
    if spy is not None:
        from bench.profile import summarize_engine, summarize_pyspy
        spy.stop()
        summary = (f"engine: {summarize_engine(profile / 'engine')}. Python program (py-spy): "
                   + (spy.error or summarize_pyspy(profile / "program.txt")) + ".")
    events = tail.stop() if tail else []
    timed_out = wall >= timeout
    stdout, stderr = out_path.read_text(errors="replace"), err_path.read_text(errors="replace")
    if timed_out:
        stderr += f"\n[bench] killed after {timeout:.0f} s"
    return Run(list(args), proc.returncode if not timed_out else -9, wall, sampler.peak, sampler.peak_pss,
               sampler.breakdown(), sampler.cpu_breakdown(), sampler.peak_procs, rusage.ru_maxrss * 1024,
               rusage.ru_utime + rusage.ru_stime, stdout, stderr,
               events, started, summary)


def kill_tree(root: int) -> None:
    """SIGKILL a process this benchmark started, and everything below it (by pid)."""
    for pid in reversed(descendants(root)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- throwaway projects ----------------------------------------------------------------------------


def kontinuum_project(path: Path) -> Path:
    """A project directory running the repo's own program (__main__.py linked), outside the
    repo, so stack config files never land in stacks/."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / "Pulumi.yaml").write_text("name: kontinuum\nruntime: python\n"
                                      "description: Kontinuum under benchmark (bench/), the repo's own program.\n")
    (path / "__main__.py").symlink_to(ROOT / "__main__.py")
    return path


def empty_project(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / "Pulumi.yaml").write_text("name: bench-empty\nruntime: python\ndescription: An empty program (baseline).\n")
    (path / "__main__.py").write_text("import pulumi  # noqa: F401 - an empty program: no resource, no output\n")
    return path


def new_stack(project: Path, name: str, state: Path) -> Stack:
    shutil.rmtree(state, ignore_errors=True)
    return Stack(project, name, state, passphrase=PASSPHRASE).init()


def write_config(stack: Stack, config: dict) -> None:
    """Put structured `kontinuum:` config into the stack's file (keeps the encryption salt
    `stack init` wrote)."""
    path = stack.project_dir / f"Pulumi.{stack.name}.yaml"
    doc = yaml.safe_load(path.read_text()) if path.exists() else {}
    doc = doc or {}
    doc.setdefault("config", {}).update(config)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def lab_addon_defaults(acme_ca: Path, timeouts: dict | None = None) -> dict:
    """The lab stack's hub and zone defaults (stacks/Pulumi.lab.yaml), with absolute chart paths
    since the bench project lives outside the repo, and `acme_ca` (the CA of the ACME server the
    bench's lab runs) as the ACME CA bundle file."""
    lab = yaml.safe_load((ROOT / "stacks" / "Pulumi.lab.yaml").read_text())["config"]
    lab["kontinuum:hub"]["acme"]["caBundleFile"] = str(acme_ca)
    defaults = lab["kontinuum:defaults"]
    addons = defaults["addons"]
    addons["cilium"]["chart"]["path"] = str(ROOT / addons["cilium"]["chart"]["path"])
    addons["certManager"]["chart"]["path"] = str(ROOT / addons["certManager"]["chart"]["path"])
    addons["gatewayApi"]["source"] = str(ROOT / addons["gatewayApi"]["source"])
    defaults["timeouts"] = {**defaults.get("timeouts", {}), **(timeouts or {})}
    return {"kontinuum:hub": lab["kontinuum:hub"], "kontinuum:defaults": defaults}


def zone_name(i: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return letters[i] if i < 26 else f"z{i:02d}"


def destroy_quietly(stack: Stack, timeout: float = 600) -> str | None:
    """Destroy and remove a throwaway stack; returns a problem description or None."""
    try:
        r = stack.run("destroy", "--yes", "--skip-preview", timeout=timeout, check=False)
        if r.returncode != 0:
            return f"destroy exited {r.returncode}: {(r.stdout + r.stderr).strip().splitlines()[-1:]}"
        stack.run("stack", "rm", "--yes", "--force", "--stack", stack.name, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return f"destroy did not finish within {timeout:.0f} s"
    return None
