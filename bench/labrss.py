"""labrss: peak RSS of the lab itself for 1, 4 and 8 zones.

The lab is the supervisor process (Talos emulator, stand-ins, node control endpoints, in
threads) and everything it started: the hub's etcd + kube-apiserver and, per bootstrapped
zone, etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok. Its RSS is
summed over that process tree every 100 ms from /proc during each zones run (lab up done →
`pulumi up` finished + 2 s), so these figures come from the same runs as `zones` (and cost no
run of their own). Shared pages count once per process: an upper bound.
"""

from __future__ import annotations

from bench import common, zones
from bench.report import Section


def run(ctx) -> Section:
    sec = Section("labrss", "peak RSS of the lab for 1, 4 and 8 zones")
    sessions = zones.run_sessions(ctx)
    if "zones_unusable" in ctx.artifacts:
        sec.not_measured(f"the lab is not usable: {ctx.artifacts['zones_unusable']}")
        return sec
    rows = []
    for k in ctx.zone_sizes:
        measured = [s for s in sessions if s.zones == k and s.lab_peak]
        converged = [s for s in measured if s.ok]
        if not measured:
            rows.append([str(k), "—", "—", "—", "not measured: no run of this size got a lab up"])
            continue
        peak = common.Series([common.mib(s.lab_peak) for s in measured])
        steady = common.Series([common.mib(s.lab_steady) for s in converged])
        last = measured[-1]
        note = "" if converged else "the zones did not converge: peak of a partial bring-up"
        idle = common.Series([s.lab_idle_cores for s in converged if s.lab_idle_cores is not None])
        rows.append([str(k), peak.fmt("MiB", 0), steady.fmt("MiB", 0) if steady.values else "—",
                     idle.fmt("cores", 2) if idle.values else "—",
                     f"{last.lab_procs} processes: {last.lab_breakdown}", note])
    sec.table(["zones", "peak (sum over the lab's processes)", "converged, 2 s after `up`",
               "CPU of the idle converged lab (10 s)", "at the peak (last run)", "note"], rows)
    sec.note("The idle lab's CPU is what its control planes (apiserver, controllers, scheduler, etcd, kwok) and "
             "the supervisor burn with nothing driving them; on this 2-core machine it is CPU the `pulumi up` of "
             "zones does not get.")
    return sec
