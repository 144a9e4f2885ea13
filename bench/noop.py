"""noop: a no-op `pulumi up` on a converged N-zone lab stack beside an empty program's.

Baseline: a program that only imports pulumi, its stack already up, `pulumi up --yes
--skip-preview` again, through tools/pulumi and, alternating with it, by the bare pinned engine
(common.bare_env: no wrapper, launchers or recover), the fixed cost of a run that is ours.
Subject: the converged lab stack (8 zones, or the largest size the lab held; the section says
which), the same command with --expect-no-changes. While the subject runs, the emulated Talos
nodes count every call by method (read through their control endpoints, reset just before):
mutating kinds (ApplyConfiguration, Bootstrap, Reset, Upgrade, Etcd*) must be zero. Aims: no-op
≤ 1.5 × empty; empty through tools/pulumi ≤ 1.3 × the bare engine's.
"""

from __future__ import annotations

from bench import common, labctl, runs, zones
from bench.report import Section

AIM = 1.5
AIM_WRAPPER = 1.3  # an empty program's up through tools/pulumi over the bare engine's
TIMEOUT = 600.0


def empty_baseline(ctx) -> tuple[common.Series, common.Series, common.Series, list[str]]:
    """(wall through tools/pulumi, its peak RSS, wall of the bare engine, problems), the two
    alternating run by run so that both see the same machine."""
    work = ctx.out / "noop-empty"
    project = common.empty_project(work / "project")
    stack = common.new_stack(project, "empty", work / "state")
    problems: list[str] = []
    wall, rss, bare = common.Series(), common.Series(), common.Series()
    try:
        first = runs.timed_pulumi(stack, "up", "--yes", "--skip-preview", timeout=TIMEOUT)
        if not first.ok:
            problems.append(f"first `pulumi up` of the empty program exited {first.returncode}:\n{first.tail()}")
            return wall, rss, bare, problems
        for i in range(ctx.runs):
            for kind in ("tools/pulumi", "bare engine"):
                r = runs.timed_pulumi(stack, "up", "--yes", "--skip-preview", "--expect-no-changes",
                                        timeout=TIMEOUT, bare=kind == "bare engine")
                ctx.log(f"noop: empty program up ({kind}) {i + 1}/{ctx.runs}: rc {r.returncode}, {r.wall:.2f} s")
                if not r.ok:
                    problems.append(f"empty program up ({kind}) {i + 1} exited {r.returncode}:\n{r.tail()}")
                elif kind == "bare engine":
                    bare.add(r.wall)
                else:
                    wall.add(r.wall)
                    rss.add(common.mib(r.peak_rss))
    finally:
        p = common.destroy_quietly(stack, timeout=TIMEOUT)
        if p:
            problems.append(f"cleanup of the empty stack: {p}")
    return wall, rss, bare, problems


def converged(ctx):
    """(BenchLab, ZoneStack) of a converged stack: the one zones kept, or a new one at the
    largest size that converges (8, then 4, then 1)."""
    if "converged" in ctx.artifacts:
        return ctx.artifacts["converged"], []
    problems = []
    for k in sorted(ctx.zone_sizes, reverse=True):
        s = zones.session(ctx, k, 0, keep=True)
        if s.kept:
            ctx.artifacts["converged"] = s.kept
            return s.kept, problems
        problems.append(f"{k} zone(s) did not converge for the no-op: " + "\n".join(s.problems))
    return None, problems


def run(ctx) -> Section:
    sec = Section("noop", "no-op `pulumi up` on a converged lab stack vs an empty program's")
    sec.aim = (f"no-op ≤ {AIM:g} × empty; zero mutating Talos calls; empty through tools/pulumi ≤ {AIM_WRAPPER:g} × "
               "the bare engine")
    missing = common.missing_tools("pulumi", "pulumi-language-python")
    if missing:
        sec.not_measured(f"pinned tools not built yet: {', '.join(missing)}")
        return sec
    # The converged stack first, so the empty program's runs have the same background: the
    # converged lab running (its control planes use CPU even when nothing drives them).
    why = labctl.lab_usable() or ("skipped (--noop-empty-only)" if ctx.only_empty else None)
    kept, problems = (None, []) if why else converged(ctx)
    empty, empty_rss, bare, empty_problems = empty_baseline(ctx)
    for p in empty_problems:
        sec.not_measured(p)
    sec.row("empty program, `pulumi up --yes --skip-preview` (stack already up)", empty.fmt("s", 2))
    sec.row("empty program, the bare pinned engine's `pulumi up` (no wrapper, launchers or recover)", bare.fmt("s", 2))
    if empty.values and bare.values:
        ratio = empty.median / bare.median
        sec.row("empty tools/pulumi up / bare engine", f"{ratio:.2f}")
        sec.verdict(ratio <= AIM_WRAPPER, f"empty through tools/pulumi {empty.median:.2f} s = {ratio:.2f} × the bare "
                    f"engine's {bare.median:.2f} s (aim ≤ {AIM_WRAPPER:g} ×)")
    sec.row("empty program, peak RSS of the tree", empty_rss.fmt("MiB", 0))
    if why:
        sec.not_measured(f"no-op on a converged lab stack: " + (why if why.startswith("skipped") else
                                                                    f"the lab is not usable: {why}"))
        return sec
    for p in problems:
        sec.not_measured(p)
    if kept is None:
        return sec
    sec.note(f"Both are measured with the converged {len(kept[1].zones)}-zone lab running in the background.")
    lab, zs = kept
    k = len(zs.zones)
    if k < max(ctx.zone_sizes):
        sec.note(f"The {max(ctx.zone_sizes)}-zone stack did not converge on this lab; measured on {k} zone(s).")
    wall, rss = common.Series(), common.Series()
    lab.reset_calls()
    calls_per_run = []
    last = None
    budget = common.Budget(ctx.runs, ctx.noop_budget)
    for i in budget:
        before = lab.calls()
        r = runs.timed_pulumi(zs.stack, "up", "--yes", "--skip-preview", "--expect-no-changes", timeout=TIMEOUT)
        after = lab.calls()
        calls_per_run.append({m: after.get(m, 0) - before.get(m, 0) for m in after if after.get(m, 0) != before.get(m, 0)})
        ctx.log(f"noop: {k}-zone no-op up {i + 1}/{ctx.runs}: rc {r.returncode}, {r.wall:.2f} s, "
                f"Talos calls {calls_per_run[-1] or 'none'}")
        last = r
        if not r.ok:
            sec.not_measured(f"{k}-zone no-op up {i + 1} exited {r.returncode} (with --expect-no-changes, a change "
                             f"fails it):\n{r.tail(25)}")
            continue
        wall.add(r.wall)
        rss.add(common.mib(r.peak_rss))
    total = lab.calls()
    if budget.note("--noop-budget"):
        sec.note(budget.note("--noop-budget"))
    sec.row(f"converged {k}-zone lab stack, `pulumi up --yes --skip-preview --expect-no-changes`", wall.fmt("s", 2))
    sec.row(f"{k}-zone no-op, peak RSS of the tree", rss.fmt("MiB", 0))
    if last is not None:
        sec.row(f"{k}-zone no-op, tree at the RSS peak (last run)", f"{last.peak_procs} processes: {last.breakdown}")
    if empty.values and wall.values:
        ratio = wall.median / empty.median
        sec.row("no-op / empty (medians)", f"{ratio:.2f}")
        sec.verdict(ratio <= AIM, f"no-op {wall.median:.2f} s = {ratio:.2f} × empty {empty.median:.2f} s "
                    f"(aim ≤ {AIM:g} ×)")
        if last is not None:
            sec.row(f"{k}-zone no-op, CPU by process (last run)", last.cpu_breakdown)
        if ratio > AIM and ctx.profile:
            r = runs.timed_pulumi(zs.stack, "up", "--yes", "--skip-preview", "--expect-no-changes", timeout=TIMEOUT,
                                    profile=ctx.out / "noop-profile")
            sec.note(f"Profile of one more no-op up ({r.wall:.1f} s, profiling on): {r.profile}")
    calls = ", ".join(f"{m} {n}" for m, n in sorted(total.items())) or "none"
    mutating = {m: n for m, n in total.items() if labctl.is_mutating(m) and n}
    sec.row(f"Talos calls during the {len(calls_per_run)} no-op up(s), all {k} nodes, by kind", calls)
    sec.row("of which mutating (ApplyConfiguration, Bootstrap, Reset, Upgrade, Etcd*)",
            ", ".join(f"{m} {n}" for m, n in mutating.items()) or "0")
    sec.verdict(not mutating, "zero mutating Talos calls" if not mutating else f"mutating calls: {mutating}")
    ctx.artifacts["noop_calls"] = total
    return sec
