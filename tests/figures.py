"""The suite's own figures (bench/suite.py): per test module, its wall time, the CPU seconds of
the test process and of the processes it ran and waited for (engine runs, CLIs), the labs it
stopped with their own CPU (lab/supervisor.py's usage record), and its `pulumi` runs.

Off unless KONTINUUM_SUITE_FIGURES names a directory: it only records, it never changes what runs.
Each worker appends one JSON line per module to <dir>/<worker>.jsonl; tools/pulumi appends one
line per run to the file KONTINUUM_RUN_LOG names, which this sets per module.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

DIRECTORY = os.environ.get("KONTINUUM_SUITE_FIGURES", "")
_current: dict | None = None


def _cpu() -> tuple[float, float]:
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, waited.ru_utime + waited.ru_stime


def lab_stopped(state: Path) -> None:
    """Called once a lab is down: its usage record counts for the module that ran it."""
    usage = state / "usage.json"
    if _current is not None and usage.exists():
        _current["labs"].append(json.loads(usage.read_text()))


def _close() -> None:
    global _current
    if _current is None:
        return
    rec, _current = _current, None
    own, waited = _cpu()
    runs = Path(rec.pop("run_log"))
    commands = runs.read_text().split() if runs.exists() else []
    rec.update(wall=round(time.monotonic() - rec.pop("t0"), 1), cpu_test=round(own - rec.pop("own0"), 1),
               cpu_waited=round(waited - rec.pop("waited0"), 1), pulumi_runs=len(commands),
               pulumi_commands={c: commands.count(c) for c in sorted(set(commands))})
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(DIRECTORY) / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _open(module: str) -> None:
    global _current
    own, waited = _cpu()
    slug = module.replace("/", "_").removesuffix(".py")
    _current = {"module": module, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "start": time.time(),
                "t0": time.monotonic(), "own0": own, "waited0": waited, "labs": [],
                "run_log": str(Path(DIRECTORY) / f"{slug}.runs")}
    os.environ["KONTINUUM_RUN_LOG"] = _current["run_log"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not DIRECTORY:
        return
    module = item.nodeid.split("::", 1)[0].removeprefix("tests/")
    if _current is None or _current["module"] != module:
        _close()
        _open(module)


def pytest_sessionfinish(session):
    if DIRECTORY:
        _close()
