"""The test suite's own figures (issue 26): one `make test`, exactly as CI runs it, with
tests/figures.py recording per module (wall, CPU of the test process and of what it waited for,
the labs it stopped and their CPU, `pulumi` runs) and, where this runs as root with Debian's acct
package, process accounting splitting all CPU by process kind (bench/pacct.py).

Not in `make bench`'s default set (it is the whole suite): `python -m bench --only suite`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections import defaultdict
from pathlib import Path

from bench import common, pacct, report

TIMEOUT = 90 * 60  # CI's limit


def run(ctx) -> report.Section:
    sec = report.Section("suite", "`make test`: wall time, CPU by module and by process kind",
                         aim="warm tools: at most 25 minutes on 2 cores (issue 26)")
    out = ctx.out / "suite"
    shutil.rmtree(out, ignore_errors=True)
    (out / "figures").mkdir(parents=True)
    accounting = _accounting_on(out / "pacct")
    env = {**os.environ, "KONTINUUM_SUITE_FIGURES": str(out / "figures")}
    t0 = time.monotonic()
    try:
        with open(out / "make-test.log", "w") as log:
            proc = subprocess.run(["make", "test"], cwd=common.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=TIMEOUT)
    finally:
        if accounting:
            subprocess.run(["accton", "off"], capture_output=True)
    wall = time.monotonic() - t0
    summary = summary_of((out / "make-test.log").read_text(errors="replace"))
    sec.row("make test (warm tools)", f"{wall / 60:.1f} min wall, exit {proc.returncode}: {summary}")
    sec.verdict(wall <= 25 * 60 and proc.returncode == 0, f"{wall / 60:.1f} min")
    _modules(sec, _records(out / "figures"))
    if accounting:
        _kinds(sec, pacct.read(out / "pacct"), wall)
    else:
        sec.not_measured("CPU by process kind: process accounting needs root and Debian's acct package (accton)")
    return sec


def _accounting_on(path: Path) -> bool:
    if os.geteuid() != 0 or shutil.which("accton") is None:
        return False
    path.touch()
    return subprocess.run(["accton", str(path)], capture_output=True).returncode == 0


def _records(directory: Path) -> list[dict]:
    recs = []
    for f in directory.glob("*.jsonl"):
        recs += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return recs


def _modules(sec: report.Section, recs: list[dict]) -> None:
    labs = [lab for r in recs for lab in r["labs"]]
    sec.row("modules", str(len(recs)))
    sec.row("labs (started and stopped through tests/e2e/labs.py)",
            f"{len(labs)}, {sum(lab['clusters_started'] for lab in labs)} zone control planes started, "
            f"{sum(lab['supervisor_cpu'] + lab['processes_cpu'] for lab in labs) / 60:.1f} CPU-min")
    sec.row("`pulumi` runs (tools/pulumi)", str(sum(r["pulumi_runs"] for r in recs)))
    rows = []
    for r in sorted(recs, key=lambda r: -r["wall"])[:25]:
        lab_cpu = sum(lab["supervisor_cpu"] + lab["processes_cpu"] for lab in r["labs"])
        cmds = ", ".join(f"{c} {n}" for c, n in r["pulumi_commands"].items())
        rows.append([r["module"], f"{r['wall']:.0f}", f"{r['cpu_test']:.0f}", f"{r['cpu_waited']:.0f}",
                     f"{lab_cpu:.0f}", str(sum(lab["clusters_started"] for lab in r["labs"])),
                     f"{r['pulumi_runs']}" + (f" ({cmds})" if cmds else "")])
    sec.table(["module (25 longest)", "wall s", "test CPU s", "waited-for CPU s", "lab CPU s", "zones",
               "pulumi runs"], rows)
    sec.note("waited-for CPU: the processes a test ran to their end (engine runs with their plugins and "
             "program, CLIs); lab CPU: the lab supervisor and every process it ran (control planes, kwok, "
             "cert-manager, Flux Operator)")


def _kinds(sec: report.Section, procs: list[pacct.Process], wall: float) -> None:
    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for p in procs:
        k = pacct.kind(p)
        cpu[k] += p.cpu
        count[k] += 1
    total = sum(cpu.values())
    rows = [[k, f"{cpu[k] / 60:.1f}", f"{100 * cpu[k] / total:.0f} %", str(count[k])]
            for k in sorted(cpu, key=lambda k: -cpu[k])]
    sec.table(["process kind", "CPU min", "share", "processes"], rows)
    sec.row("CPU in all", f"{total / 60:.1f} CPU-min over {wall / 60:.1f} min wall ({total / wall:.2f} cores busy)")


def summary_of(log: str) -> str:
    """pytest's last line: "1016 passed, 2 skipped in 1902.11s (0:31:42)" (without the time)."""
    m = re.search(r"=+ ([^=\n]*?) in [0-9.]+s", log)
    return m.group(1) if m else "no pytest summary"
