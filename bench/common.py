"""What every benchmark shares: machine facts, tool versions, statistics and throwaway
projects. Process trees are in proctree.py, timed `pulumi` runs in runs.py (event_log.py).

Benchmarks print figures; they are not tests. Nothing here asserts an aim: a section says
where a figure stands against it.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lab.pulumi_cli import Stack

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"  # gitignored: stacks, state, event logs, lab state of the runs
PASSPHRASE = "kontinuum-bench"  # throwaway stacks only


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
