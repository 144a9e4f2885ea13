"""zones: 1, 4 and 8 zones in one `pulumi up` on the lab; bring-up split by phase.

Each run starts a fresh bench lab with as many Talos nodes as zones (one single-node control
plane per zone, the lab stack's shape), creates a fresh stack, and times `pulumi up` from
start to exit; the event log splits every zone's bring-up into phases (bench/phases.py),
set beside the lab's floor for each phase. The lab's RSS is sampled meanwhile (labrss).
Then the lab goes down and the stack is removed; the very first run also times a bounded
`pulumi destroy` before that (a destroy per run would cost more than the runs). Aim:
t(8)/t(1) ≤ 2 and our overhead ≤ 10 % above the lab floor per phase.

Runs are bounded: the first round runs every size; further rounds (up to N) only while the
time budget lasts, so a figure may rest on fewer runs than N (the table says how many).
"""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import dataclass, field

from bench import common, labctl, phases, runs
from bench.report import Section

UP_TIMEOUT = 1500.0  # an 8-zone up on 2 cores; the stack's own waits are bounded well below
LAB_IDLE_SECONDS = 10.0  # how long the converged lab's own CPU use is measured
AIM_RATIO = 2.0
AIM_OVERHEAD = 0.10


@dataclass
class Session:
    zones: int
    run: int
    up: runs.Run | None = None
    zone_times: dict = field(default_factory=dict)
    floor: dict = field(default_factory=dict)
    cp_starts: dict = field(default_factory=dict)
    cert_manager: dict = field(default_factory=dict)  # cluster -> {"webhook"|"works"|"ready": time.time()}
    lab_up_seconds: float | None = None
    apiserver_serving: dict = field(default_factory=dict)  # zone -> time.time() its apiserver first answered HTTP
    apiserver_ready: dict = field(default_factory=dict)  # zone -> time.time() its /readyz first answered 200
    lab_peak: int = 0
    lab_steady: int = 0
    lab_breakdown: str = ""
    lab_procs: int = 0
    lab_idle_cores: float | None = None  # CPU the converged lab uses by itself
    problems: list[str] = field(default_factory=list)  # of the measured `pulumi up`
    cleanup: list[str] = field(default_factory=list)  # of the teardown after it
    kept: tuple | None = None  # (BenchLab, ZoneStack) left converged for noop

    @property
    def ok(self) -> bool:
        return self.up is not None and self.up.ok and not self.problems


def session(ctx, k: int, run: int, *, keep: bool = False) -> Session:
    """One lab, one k-zone stack, one timed `pulumi up`; cleaned up unless `keep`."""
    s = Session(k, run)
    work = ctx.out / f"zones-{k}-{run}"
    shutil.rmtree(work, ignore_errors=True)  # a fresh lab: the hub keeps its etcd data across lab up/down
    lab = labctl.BenchLab(k, work / "lab", log=ctx.log)
    zs = None
    sampler = None
    try:
        ctx.log(f"zones: lab up with {k} node(s) (run {run})")
        lab.up()
        s.lab_up_seconds = lab.up_seconds
        sampler = lab.rss_sampler().start()
        zs = labctl.new_zone_stack(lab, k, work, f"zones{k}")
        ctx.log(f"zones: pulumi up, {k} zone(s)")
        readyz = labctl.ReadyzWatcher(lab.addresses[:k]).start()
        try:
            s.up = runs.timed_pulumi(zs.stack, "up", "--yes", "--skip-preview", timeout=UP_TIMEOUT,
                                       event_log=work / "events.jsonl", sample_every=1.0)
        finally:
            readyz.stop()
        for i, a in enumerate(lab.addresses[:k]):
            if a in readyz.serving:
                s.apiserver_serving[common.zone_name(i)] = readyz.serving[a]
            if a in readyz.ready:
                s.apiserver_ready[common.zone_name(i)] = readyz.ready[a]
        ctx.log(f"zones: {k} zone(s) up: rc {s.up.returncode} in {s.up.wall:.1f} s")
        time.sleep(2.0)  # let the lab settle, then read its steady RSS
        s.lab_steady = sampler.sample()
        sampler.stop()
        s.lab_peak, s.lab_breakdown, s.lab_procs = sampler.peak, sampler.breakdown(), sampler.peak_procs
        if s.up.ok:
            s.lab_idle_cores = lab.cpu_cores(LAB_IDLE_SECONDS)
        s.zone_times = phases.zone_times(s.up.events, "bench")
        s.cp_starts = lab.control_plane_starts()
        s.cert_manager = lab.cert_manager_times()
        try:
            s.floor = {"reboot_delay": lab.reboot_delay()}
        except OSError as e:
            s.cleanup.append(f"could not read the reboot delay from the node control endpoint (floor uses 1 s): {e}")
        if not s.up.ok:
            s.problems.append(f"`pulumi up` of {k} zone(s) exited {s.up.returncode}; last lines:\n{s.up.tail(25)}")
        if keep and s.ok:
            s.kept = (lab, zs)
            return s
    except Exception as e:  # noqa: BLE001 - a failed run is reported, and cleaned up
        s.problems.append(f"{type(e).__name__}: {e}")
    finally:
        if sampler is not None:
            sampler.stop()
            s.lab_peak = max(s.lab_peak, sampler.peak)
        if s.kept is None:
            first = "destroy" not in ctx.artifacts
            if first:
                ctx.artifacts["destroy"] = {}
            teardown(ctx, lab, zs, s.cleanup, destroy=first, record=ctx.artifacts.get("destroy") if first else None)
    return s


def teardown(ctx, lab: labctl.BenchLab, zs, problems: list[str], *, destroy: bool = False,
             record: dict | None = None) -> None:
    """Stop the lab and drop the stack. With `destroy`, `pulumi destroy` runs first (bounded);
    either way the lab goes down and the stack is removed with --force: every resource of a
    bench stack lived in that lab, so nothing outlives it."""
    if zs is not None and destroy:
        ctx.log(f"zones: destroying the {len(zs.zones)}-zone stack (bound {ctx.destroy_timeout:.0f} s)")
        r = runs.timed_pulumi(zs.stack, "destroy", "--yes", "--skip-preview", timeout=ctx.destroy_timeout)
        ctx.log(f"zones: destroy rc {r.returncode} in {r.wall:.0f} s")
        if record is not None:
            record.update(wall=r.wall, ok=r.ok, zones=len(zs.zones))
        if not r.ok:
            stuck = pending_operations(zs.stack)
            why = (f"`pulumi destroy` of {len(zs.zones)} zone(s) "
                   + (f"did not finish within {ctx.destroy_timeout:.0f} s" if r.returncode == -9
                      else f"exited {r.returncode}")
                   + (f"; still in progress: {stuck}" if stuck else f"; last lines:\n{r.tail(15)}"))
            if record is not None:
                record["problem"] = why
            problems.append(f"cleanup: {why}")
    p = lab.down()
    if p:
        problems.append(f"cleanup: {p}")
    if zs is not None:
        zs.stack.run("stack", "rm", "--yes", "--force", "--stack", zs.stack.name, timeout=120, check=False)


def pending_operations(stack) -> str:
    try:
        ops = stack.export()["deployment"].get("pending_operations") or []
    except Exception:  # noqa: BLE001 - a diagnostic only
        return ""
    return ", ".join(f"{o.get('type')} {o['resource']['type']} {o['resource']['urn'].rsplit('::', 1)[-1]}"
                     for o in ops)


def run_sessions(ctx) -> list[Session]:
    """Every zones session (memoised on ctx, so noop and labrss reuse them)."""
    if "zones" in ctx.artifacts:
        return ctx.artifacts["zones"]
    sessions: list[Session] = []
    ctx.artifacts["zones"] = sessions
    why = labctl.lab_usable()
    if why:
        ctx.artifacts["zones_unusable"] = why
        return sessions
    t0 = time.monotonic()
    for run in range(1, ctx.runs + 1):
        spent = time.monotonic() - t0
        if run > 1 and spent + spent / (run - 1) > ctx.zones_budget:
            ctx.log(f"zones: another round would pass the {ctx.zones_budget:.0f} s budget; stopping after "
                    f"{run - 1} round(s)")
            ctx.artifacts["zones_rounds"] = run - 1
            break
        # The largest size stays converged after its run, for noop; the one an earlier round
        # kept goes down before this round starts, so two labs never run at once.
        cleanup(ctx)
        for k in ctx.zone_sizes:
            keep = ctx.keep_converged and k == max(ctx.zone_sizes)
            s = session(ctx, k, run, keep=keep)
            sessions.append(s)
            if s.kept:
                ctx.artifacts["converged"] = s.kept
    return sessions


def run(ctx) -> Section:
    sec = Section("zones", "1, 4 and 8 zones in one `pulumi up` on the lab; bring-up by phase")
    sec.aim = f"t(8)/t(1) ≤ {AIM_RATIO:g}; our overhead ≤ {AIM_OVERHEAD:.0%} above the lab floor per phase"
    sessions = run_sessions(ctx)
    if ctx.artifacts.get("zones_rounds"):
        sec.note(f"Rounds stopped after {ctx.artifacts['zones_rounds']} of {ctx.runs}: another would pass the "
                 f"{ctx.zones_budget:.0f} s budget (--zones-budget).")
    if "zones_unusable" in ctx.artifacts:
        sec.not_measured(f"the lab is not usable: {ctx.artifacts['zones_unusable']}")
        return sec
    by_size: dict[int, list[Session]] = {}
    for s in sessions:
        by_size.setdefault(s.zones, []).append(s)
    walls: dict[int, common.Series] = {}
    rows = []
    for k in ctx.zone_sizes:
        ss = by_size.get(k, [])
        good = [s for s in ss if s.ok]
        for s in ss:
            if not s.ok:
                sec.not_measured(f"{k} zone(s), run {s.run}: " + "\n".join(s.problems))
        if not good:
            rows.append([str(k), "—", "—", f"0 of {len(ss)}"])
            continue
        w = common.Series([s.up.wall for s in good])
        walls[k] = w
        per_zone = common.Series([t for s in good for z in s.zone_times.values()
                                  if (t := z.total(s.up.started)) is not None])
        rows.append([str(k), w.fmt("s"), per_zone.fmt("s"), f"{len(good)} of {len(ss)}"])
    sec.table(["zones", "`pulumi up` wall", "zone ready (start of up → its registry join)", "runs ok"], rows)
    lo, hi = min(ctx.zone_sizes), max(ctx.zone_sizes)
    if lo in walls and hi in walls:
        ratio = walls[hi].median / walls[lo].median
        sec.row(f"t({hi})/t({lo}) (medians)", f"{ratio:.2f}")
        sec.verdict(ratio <= AIM_RATIO, f"t({hi})/t({lo}) = {ratio:.2f} vs aim {AIM_RATIO:g}")
    else:
        sec.not_measured(f"t({hi})/t({lo}): needs a successful run of both sizes")

    floor_sums = {k: phase_table(sec, k, good) for k in ctx.zone_sizes
                  if (good := [s for s in by_size.get(k, []) if s.ok])}
    if lo in floor_sums and hi in floor_sums and floor_sums[lo]:
        sec.row(f"the lab floor's own growth: sum of the phase floors at {hi} zones / at {lo} "
                f"({floor_sums[hi]:.1f} s / {floor_sums[lo]:.1f} s)", f"{floor_sums[hi] / floor_sums[lo]:.2f}")
    detail = next((s for k in ctx.zone_sizes for s in by_size.get(k, []) if s.ok), None)
    if detail is not None:
        zt = detail.zone_times[sorted(detail.zone_times)[0]]
        t0 = detail.up.started
        sec.tables.append(f"**Steps of zone {zt.zone}** ({detail.zones} zone(s), run {detail.run}): each resource's "
                          "create, from its resourcePreEvent to its resOutputsEvent, seconds after `pulumi up` started")
        sec.table(["resource", "phase", "start", "end", "took"],
                  [[name, phase, f"{a - t0:.2f}", f"{b - t0:.2f}", f"{b - a:.2f}"]
                   for phase, name, a, b in sorted(zt.steps, key=lambda x: x[2])])
    d = ctx.artifacts.get("destroy") or {}
    if d.get("ok"):
        sec.row(f"`pulumi destroy` of {d['zones']} zone(s) (first run only)", f"{d['wall']:.1f} s")
    elif d.get("problem"):
        sec.row(f"`pulumi destroy` of {d['zones']} zone(s) (first run only)", f"failed after {d['wall']:.0f} s")
        sec.not_measured(d["problem"])
    for s in sessions:
        for c in s.cleanup:
            if c.removeprefix("cleanup: ") != d.get("problem"):
                sec.note(f"{s.zones} zone(s), run {s.run}: {c}")
    cps = [v for s in sessions if s.ok for v in s.cp_starts.values()]
    if cps:
        sec.note(f"Lab control-plane start to stand-ins running (etcd + apiserver + controllers + kwok + node "
                 f"registration per zone, from the supervisor log), all runs: median {statistics.median(cps):.1f} s, max {max(cps):.1f} s over {len(cps)} "
                 "clusters. Lab start (`python -m lab up`, hub + nodes) is not in any figure: "
                 + ", ".join(f"{s.zones} nodes {s.lab_up_seconds:.0f} s" for s in sessions if s.lab_up_seconds) + ".")
    ready = [s.apiserver_ready[z] - s.apiserver_serving[z] for s in sessions if s.ok for z in s.apiserver_ready
             if z in s.apiserver_serving]
    if ready:
        sec.note(f"A zone apiserver serves HTTP (the kubeconfig floor) {statistics.median(ready):.1f} s (median) before "
                 "its /readyz first answers 200.")
    sec.note("Phase increments: end(phase) − end(previous phase) per zone, where a phase ends when its last "
             "resource's outputs event appears in the event log (stamped on read, ~20 ms), the first (startup) "
             "measured from the start of `pulumi up` to the first resource registered. 'own steps' is the summed "
             "create time of the phase's resources (resourcePreEvent → resOutputsEvent); the rest of an increment "
             "is the engine scheduling the step after its dependencies finished, and the provider's own start. "
             "Floors are the lab's imposed delays (expected values), named per phase; kubeconfig's floor is "
             "measured: bootstrap done → the zone's apiserver serves HTTP. A phase with a zero floor cannot meet "
             "a relative aim: its overhead is given in seconds.")
    return sec


def phase_table(sec: Section, k: int, sessions: list[Session]) -> float:
    """The k-zone phase table; returns the sum of its phase floors (what the lab alone takes)."""
    incs: dict[str, list[float]] = {p: [] for p in phases.PHASE_NAMES}
    busy: dict[str, list[float]] = {p: [] for p in phases.PHASE_NAMES}
    for s in sessions:
        for zt in s.zone_times.values():
            for p, v in zt.increments(s.up.started).items():
                incs[p].append(v)
            for p, v in zt.busy.items():
                busy[p].append(v)
    # The kubeconfig phase's floor, per zone: bootstrap done → the lab's apiserver serves.
    api = [s.apiserver_serving[z] - zt.ends["bootstrap"] for s in sessions for z, zt in s.zone_times.items()
           if z in s.apiserver_serving and "bootstrap" in zt.ends]
    reboot = next((s.floor["reboot_delay"] for s in sessions if "reboot_delay" in s.floor), 1.0)
    # cert-manager's phase: its webhook's start; downstream: the Certificate's issuance (per zone).
    cm_start = [t["works"] - t["webhook"] for s in sessions for t in s.cert_manager.values()
                if "works" in t and "webhook" in t]
    issued = [s.cert_manager[f"bench-{z}"]["ready"] - created for s in sessions for z, zt in s.zone_times.items()
              if "ready" in s.cert_manager.get(f"bench-{z}", {})
              for created in [next((b for ph, name, _, b in zt.steps if name == "certificate"), None)]
              if created is not None]
    floors = phases.lab_floor(reboot, statistics.median(api) if api else None,
                              statistics.median(cm_start) if cm_start else None,
                              statistics.median(issued) if issued else None)
    rows, misses = [], []
    for p, label in phases.PHASES:
        if not incs[p]:
            rows.append([label, "—", "—", "—", "—", "—"])
            continue
        med = statistics.median(incs[p])
        floor, why = floors[p]
        b = statistics.median(busy[p]) if busy[p] else 0.0
        if floor is None:
            over, pct = "—", "—"
        else:
            over = f"{med - floor:+.2f} s"
            pct = f"{(med - floor) / floor:+.0%}" if floor > 0 else "n/a (floor 0)"
            if floor > 0 and (med - floor) / floor > AIM_OVERHEAD:
                misses.append(p)
        spread = f"{min(incs[p]):.2f}–{max(incs[p]):.2f}"
        rows.append([label, f"{med:.2f} s ({spread})", f"{b:.2f} s",
                     f"{floor:.2f} s" if floor is not None else "—", over, pct])
    sec.tables.append(f"**{k} zone(s)**: per-phase increments, medians over {len(sessions)} run(s) × {k} zone(s)")
    sec.table(["phase", "increment (min–max)", "own steps", "lab floor", "our overhead", "over floor"], rows)
    sec.tables.append("Floors: " + "; ".join(f"{p}: {why}" for p, (_, why) in floors.items()) + ".")
    if misses:
        sec.verdict(False, f"{k} zone(s): overhead above {AIM_OVERHEAD:.0%} of a non-zero floor in: "
                    + ", ".join(misses))
    elif rows:
        sec.verdict(True, f"{k} zone(s): every phase with a non-zero floor within {AIM_OVERHEAD:.0%}")
    return sum(f for f, _ in floors.values() if f is not None)


def cleanup(ctx) -> None:
    kept = ctx.artifacts.pop("converged", None)
    if kept:
        lab, zs = kept
        problems: list[str] = []
        teardown(ctx, lab, zs, problems)
        for p in problems:
            ctx.log(f"zones cleanup: {p}")
