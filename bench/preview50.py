"""preview50: `pulumi preview` of a fresh 50-zone stack with the lab down.

The CI case (DESIGN §2): a plan for a whole region, contacting no machine and no hub. Each
zone has one Talos address on 127.0.200.<i> where nothing listens; the hub kubeconfig file
points at https://127.0.200.254:6443 where nothing listens either. Figures: wall time of the
whole `pulumi preview` and the peak RSS of its process tree (engine, language host, the
Python program, the dynamic-provider hosts and the kubernetes plugin), summed over the tree
from /proc every 100 ms (wait4's ru_maxrss only gives the largest single process; shown
beside it). Aims (issue 21): ≤ 10 × an empty program's `pulumi up` measured in the same run
(bench/noop.py's baseline), and ≤ 2 GiB summed RSS. Also: ms of the Python program's CPU per
planned resource, and one run with KONTINUUM_SDK_SPEEDUPS=0 beside it (the SDK's own end wait and
debug lines, kontinuum_components/sdk_speedups.py).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from bench import common, noop, runs
from bench.report import Section
from lab.acme import ensure_ca

ZONES = 50
FIRST = ipaddress.ip_address("127.0.200.1")
DEAD_HUB = "https://127.0.200.254:6443"
AIM_RATIO = 10.0  # × the empty program's up, same run
AIM_RSS_MIB = 2048.0
PROGRAM = "pulumi-language-python-exec"
TIMEOUT = 600.0


def dead_hub_kubeconfig() -> str:
    return ("apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: hub, cluster: {{server: '{DEAD_HUB}', insecure-skip-tls-verify: true}}}}]\n"
            "users: [{name: hub, user: {token: bench-not-a-credential}}]\n"
            "contexts: [{name: hub, context: {cluster: hub, user: hub}}]\ncurrent-context: hub\n")


def stack_config(zones: int, hub_file: str, acme_ca: Path) -> dict:
    cfg = {"kontinuum:region": "bench", "kontinuum:hubKubeconfigFile": hub_file, **common.lab_addon_defaults(acme_ca)}
    cfg["kontinuum:zones"] = [{"zone": common.zone_name(i), "talosAddresses": [str(FIRST + i)]} for i in range(zones)]
    return cfg


def _failed(sec: Section, r: runs.Run, what: str) -> None:
    errors = [ln.strip() for ln in r.stdout.splitlines() if "error:" in ln]
    planned = re.search(r"\+\s*(\d+)\s+to create", r.stdout)
    sec.not_measured(
        f"{what} exited {r.returncode}, so no figure stands for a complete plan. Up to the failure "
        f"({planned.group(1) if planned else '?'} resources planned): {r.wall:.1f} s wall, peak tree RSS "
        f"{common.mib(r.peak_rss):.0f} MiB, PSS {common.mib(r.peak_pss):.0f} MiB, over {r.peak_procs} processes "
        f"({r.breakdown}); CPU by process: {r.cpu_breakdown}. First error:\n{errors[0] if errors else r.tail(20)}")


def cpu_of(r: runs.Run, process: str) -> float | None:
    """CPU seconds of one process name from a run's by-process breakdown."""
    m = re.search(rf"{re.escape(process)} ×\d+ ([\d.]+) s", r.cpu_breakdown)
    return float(m.group(1)) if m else None


def run(ctx) -> Section:
    sec = Section("preview50", f"`pulumi preview` of a {ZONES}-zone stack, lab down")
    sec.aim = f"≤ {AIM_RATIO:g} × the empty program's up (same run), ≤ {AIM_RSS_MIB:.0f} MiB summed RSS"
    missing = common.missing_tools("pulumi", "pulumi-language-python", "pulumi-resource-kubernetes")
    if missing:
        sec.not_measured(f"pinned tools not built yet: {', '.join(missing)} (tools/install.sh --print-bin)")
        return sec
    work = ctx.out / "preview50"
    project = common.kontinuum_project(work / "project")
    hub_file = work / "hub.kubeconfig"
    hub_file.write_text(dead_hub_kubeconfig())
    stack = common.new_stack(project, "preview50", work / "state")
    ctx.artifacts["preview50"] = {"stack": stack}
    acme_ca = work / "acme"
    ensure_ca(acme_ca)  # no ACME server runs (lab down); the config check only reads the file
    common.write_config(stack, stack_config(ZONES, str(hub_file), acme_ca / "ca.crt"))

    wall, rss, pss, single, cpu, program = (common.Series() for _ in range(6))
    last = None
    budget = common.Budget(ctx.runs, ctx.preview_budget)
    for i in budget:
        r = runs.timed_pulumi(stack, "preview", timeout=TIMEOUT)
        ctx.log(f"preview50 run {i + 1}/{ctx.runs}: rc {r.returncode}, {r.wall:.1f} s, "
                f"peak tree RSS {common.mib(r.peak_rss):.0f} MiB")
        if not r.ok:
            _failed(sec, r, f"`pulumi preview` (run {i + 1})")
            return sec
        wall.add(r.wall)
        rss.add(common.mib(r.peak_rss))
        pss.add(common.mib(r.peak_pss))
        single.add(common.mib(r.maxrss_single))
        cpu.add(r.cpu)
        if cpu_of(r, PROGRAM) is not None:
            program.add(cpu_of(r, PROGRAM))
        last = r
    assert last is not None
    if budget.note("--preview-budget"):
        sec.note(budget.note("--preview-budget"))
    creates = re.search(r"\+\s*(\d+)\s+to create", last.stdout)
    sec.row("wall time", wall.fmt("s"))
    sec.row("peak RSS, process tree (sum, sampled every 100 ms)", rss.fmt("MiB", 0))
    sec.row("peak PSS, process tree (sum, sampled every 1 s; shared pages split)", pss.fmt("MiB", 0))
    sec.row("largest single process (wait4 ru_maxrss)", single.fmt("MiB", 0))
    sec.row("CPU time of the tree (user+sys, reaped processes)", cpu.fmt("s"))
    sec.row("resources planned", creates.group(1) if creates else "?")
    sec.row("tree at the RSS peak (last run)", f"{last.peak_procs} processes: {last.breakdown}")
    sec.row("CPU by process (last run, from /proc samples)", last.cpu_breakdown)
    planned = int(creates.group(1)) if creates else 0
    if program.values and planned:
        sec.row("Python program CPU per planned resource", f"{1000 * program.median / planned:.1f} ms")
    empty, _rss, problems = noop.empty_baseline(ctx)
    for p in problems:
        sec.not_measured(p)
    met = rss.median <= AIM_RSS_MIB
    if empty.values:
        ratio = wall.median / empty.median
        sec.row("empty program, `pulumi up --yes --skip-preview` (same run)", empty.fmt("s", 2))
        sec.row("preview50 / empty", f"{ratio:.1f}")
        met = met and ratio <= AIM_RATIO
        sec.verdict(ratio <= AIM_RATIO, f"preview50 {wall.median:.1f} s = {ratio:.1f} × empty {empty.median:.2f} s "
                                        f"(aim ≤ {AIM_RATIO:g} ×)")
    sec.verdict(rss.median <= AIM_RSS_MIB, f"summed RSS {rss.median:.0f} MiB (aim ≤ {AIM_RSS_MIB:.0f}); PSS "
                f"{pss.median:.0f} MiB: each kubernetes provider maps the same binary, counted once per process")

    r = runs.timed_pulumi(stack, "preview", timeout=TIMEOUT, extra_env={"KONTINUUM_SDK_SPEEDUPS": "0"})
    ctx.log(f"preview50 with KONTINUUM_SDK_SPEEDUPS=0: rc {r.returncode}, {r.wall:.1f} s")
    if r.ok:
        sec.row("same, KONTINUUM_SDK_SPEEDUPS=0 (the SDK's own end wait and debug lines; 1 run)",
                f"{r.wall:.1f} s wall, CPU by process: {r.cpu_breakdown}")

    if not met and ctx.profile:
        r = runs.timed_pulumi(stack, "preview", timeout=TIMEOUT, profile=work / "profile")
        sec.note(f"Profile of one more run ({r.wall:.1f} s, profiling on): {r.profile}")
    return sec


def cleanup(ctx) -> None:
    art = ctx.artifacts.get("preview50")
    if art:
        # Only previews ran: nothing to destroy; remove the stack.
        art["stack"].run("stack", "rm", "--yes", "--force", "--stack", art["stack"].name, timeout=120, check=False)
