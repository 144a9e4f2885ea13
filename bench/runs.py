"""Timed `pulumi` runs: the pinned engine through tools/pulumi, its process tree sampled, its
event log followed, wall and rusage figures taken; a profile of what dominated on request.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bench.event_log import Event, EventTail
from bench.profile import ProgramSpy, summarize_engine, summarize_pyspy
from bench.proctree import SAMPLE_EVERY, TreeSampler, kill_tree
from bench.common import ROOT, tools_bin
from lab.pulumi_cli import WRAPPER, Stack


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
