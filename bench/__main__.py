"""Benchmarks (issue 9): `make bench`, or

    venv/bin/python -m bench [--runs N] [--only preview50,noop,zones,labrss,upgrade,rollout] [--zones 1,4,8] [--profile]
                             [--preview-budget S] [--zones-budget S] [--noop-budget S] [--destroy-timeout S]

Runs each benchmark N times (default 3; BENCH_RUNS also sets it), prints every section and
writes bench/RESULTS.md: machine facts, tool versions, then one section per benchmark
(median, min and max of the runs). The budgets keep `make bench` near 30 minutes: a benchmark
whose runs are slow does fewer than N and says so. A subset replaces only its own sections. Work files
(throwaway stacks, their state, event logs, the bench lab's state) go to bench/out/
(gitignored); every stack is destroyed and every lab taken down before this exits.

Execution order differs from the report's: zones runs before noop, so noop's lab half reuses
the converged largest stack zones leaves up, and labrss reads the lab RSS sampled in zones.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import common, labrss, noop, preview50, report, rollout, suite, upgrade, zones

BENCHMARKS = {"preview50": preview50, "noop": noop, "zones": zones, "labrss": labrss, "upgrade": upgrade,
              "rollout": rollout, "suite": suite}
REPORT_ORDER = ["preview50", "noop", "zones", "labrss", "upgrade", "rollout", "suite"]
DEFAULT = [b for b in REPORT_ORDER if b != "suite"]  # the suite only when asked: it is the whole `make test`
ANALYSIS = "analysis"  # written by hand into RESULTS.md between its markers; kept verbatim
RUN_ORDER = ["preview50", "zones", "noop", "labrss", "upgrade", "rollout", "suite"]
RESULTS = common.ROOT / "bench" / "RESULTS.md"


@dataclass
class Context:
    runs: int
    out: Path
    zone_sizes: tuple[int, ...]
    zones_budget: float
    keep_converged: bool
    only_empty: bool = False
    preview_budget: float = 420.0
    profile: bool = False
    destroy_timeout: float = 240.0
    noop_budget: float = 300.0
    artifacts: dict = field(default_factory=dict)
    t0: float = field(default_factory=time.monotonic)

    def log(self, msg: str) -> None:
        print(f"[bench {time.monotonic() - self.t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", "3")), help="runs per figure (3)")
    p.add_argument("--only", default="", help="comma-separated subset of " + ",".join(REPORT_ORDER))
    p.add_argument("--zones", default="1,4,8", help="zone counts for zones/labrss/noop (1,4,8)")
    p.add_argument("--zones-budget", type=float, default=float(os.environ.get("BENCH_ZONES_BUDGET", "1080")),
                   help="zones starts no round that would end past this many seconds (1080)")
    p.add_argument("--preview-budget", type=float, default=float(os.environ.get("BENCH_PREVIEW_BUDGET", "420")),
                   help="preview50 starts no run that would end past this many seconds (420)")
    p.add_argument("--profile", action="store_true",
                   help="profile one more run where a figure misses its aim (engine pprof, py-spy from PyPI)")
    p.add_argument("--noop-budget", type=float, default=300.0,
                   help="noop starts no lab no-op up that would end past this many seconds (300)")
    p.add_argument("--destroy-timeout", type=float, default=240.0,
                   help="bound of the one timed `pulumi destroy` zones runs (240 s)")
    p.add_argument("--noop-empty-only", action="store_true", help="noop: only the empty-program baseline")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    only = [b for b in args.only.split(",") if b] or DEFAULT
    unknown = set(only) - set(BENCHMARKS)
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    if args.runs < 1:
        p.error("--runs must be at least 1")
    sizes = tuple(sorted({int(z) for z in args.zones.split(",")}))

    machine, versions = common.machine_facts(), common.tool_versions()
    try:
        versions["pulumi (engine, reported)"] = os.popen(f"{common.tools_bin()}/pulumi version 2>/dev/null").read().strip() or "not built"
    except Exception:  # noqa: BLE001 - a fact, not a requirement
        pass
    started = common.now()
    common.OUT.mkdir(parents=True, exist_ok=True)
    ctx = Context(args.runs, common.OUT, sizes, args.zones_budget, keep_converged="noop" in only,
                  only_empty=args.noop_empty_only, preview_budget=args.preview_budget, profile=args.profile,
                  destroy_timeout=args.destroy_timeout, noop_budget=args.noop_budget)
    sections: dict[str, report.Section] = {}
    try:
        for name in RUN_ORDER:
            if name not in only:
                continue
            ctx.log(f"{name}: start")
            try:
                sec = BENCHMARKS[name].run(ctx)
            except Exception as e:  # noqa: BLE001 - one failing benchmark must not lose the others
                sec = report.Section(name, "failed")
                sec.not_measured(f"the benchmark raised {type(e).__name__}: {e}")
            sec.runs = args.runs
            sec.load_end = common.loadavg()
            sections[name] = sec
            ctx.log(f"{name}: done")
    finally:
        for name in RUN_ORDER:
            cleanup = getattr(BENCHMARKS[name], "cleanup", None)
            if cleanup:
                try:
                    cleanup(ctx)
                except Exception as e:  # noqa: BLE001
                    ctx.log(f"{name}: cleanup failed: {e}")

    kept = report.kept_sections(args.results.read_text()) if args.results.exists() else {}
    parts = [report.header(machine, versions, args.runs, started)]
    for name in REPORT_ORDER:
        if name in sections:
            parts.append(sections[name].markdown())
        elif name in kept:
            parts.append(kept[name])
        else:
            parts.append(f"<!-- bench:{name} -->\n## {name}\n\nNot run yet.\n<!-- /bench:{name} -->")
    if ANALYSIS in kept:
        parts.append(kept[ANALYSIS])
    text = "\n\n".join(parts) + "\n"
    args.results.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
