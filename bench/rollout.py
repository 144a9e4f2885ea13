"""rollout: what a rolling reboot of 5 nodes adds over the machines' own reboot and kubelet delays.

A bench lab with one zone of 3 control planes and 2 workers is brought up; then every node gets a
reboot delay R and a kubelet start delay K (the lab's knobs: off the network for R, the Node
Ready again only K after boot plus its Cilium agent), and a config patch that needs a reboot
(`machine.env`) is applied with `pulumi up`. The zone's ConfigRollout reboots the nodes one at a
time behind the readiness gate. The figure is its step's wall time (the engine's event log)
over the time the machines themselves were away: per node, from its reboot to its Node Ready
on the new boot (the lab's events), summed. That is R + K plus the lab's Cilium agent coming
back (the DaemonSet replaces the pod the shutdown ended; kwok runs it), which a real node pays
too. What is left is the rollout's own cost: cordon, drain, apply, the readiness gate's polling,
the etcd gates, uncordon. Aim: ≤ 1.1. The ratio over the bare 5 × (R + K) is shown as well.
"""

from __future__ import annotations

import shutil

from bench import common, labctl, runs
from bench.report import Section
from lab.talos_node import control

REBOOT, KUBELET = 10.0, 5.0  # seconds: the lab's knobs for this run
AIM = 1.1
UP_TIMEOUT = 1200.0
PATCH = [{"op": "add", "path": "/machine/env", "value": {"BENCH_ROLLOUT": "1"}}]  # Talos 1.13: a reboot
ENDPOINT_HOST = "127.0.30.10"  # the zone's API endpoint: the lab serves it in front of the control planes


def _config(lab: labctl.BenchLab, patches: list) -> dict:
    cfg = labctl.zone_stack_config(lab, 0)
    machines = [{"address": a, "pool": "controlplane"} for a in lab.addresses[:3]]
    machines += [{"address": a, "pool": "web"} for a in lab.addresses[3:5]]
    cfg["kontinuum:zones"] = [{"zone": "a", "talosAddresses": machines, "patches": patches,
                               "controlPlane": {"replicas": 3, "endpoint": f"https://{ENDPOINT_HOST}:6443"},
                               "workers": [{"name": "web", "replicas": 2}]}]
    return cfg


def rollout_seconds(events) -> float | None:
    """Wall time of the ConfigRollout step: its pre-event to its outputs event."""
    start = end = None
    for e in events:
        meta = (e.data.get("metadata") or {})
        if ":ConfigRollout::" not in str(meta.get("urn", "")):
            continue
        if e.kind == "resourcePreEvent" and start is None:
            start = e.t
        elif e.kind == "resOutputsEvent":
            end = e.t
    return end - start if start is not None and end is not None else None


def node_times(addresses: list[str]) -> list[tuple]:
    """(reboot apply, address, down, booted, Node Ready) per node, in reboot order, from the lab's event logs."""
    times = []
    for a in addresses:
        log = control.read_state(a)["events"]
        applied = [e["time"] for e in log if e["event"] == "apply" and e.get("mode") == "reboot"]
        if not applied:
            continue
        after = lambda kind: next((e["time"] for e in log if e["event"] == kind and e["time"] >= applied[-1]), None)
        times.append((applied[-1], a, after("reboot"), after("booted"), after("node-ready")))
    return sorted(times)


def away_seconds(times: list[tuple]) -> float | None:
    """How long the machines themselves were away: reboot to Node Ready, summed over the nodes."""
    spans = [ready - down for _, _, down, _, ready in times if down is not None and ready is not None]
    return sum(spans) if len(spans) == len(times) and spans else None


def node_phases(times: list[tuple]) -> list[list[str]]:
    """Per node: the graceful shutdown, the reboot delay (plus the emulator's boot), the kubelet
    delay plus the way to a Ready Node, and the gap until the next node's reboot apply (the
    readiness gate, uncordon, next cordon and drain)."""
    rows = []
    for i, (applied, a, down, booted, ready) in enumerate(times):
        nxt = times[i + 1][0] if i + 1 < len(times) else None
        gap = lambda x, y: f"{y - x:.1f} s" if x is not None and y is not None else "–"
        rows.append([a, gap(applied, down), gap(down, booted), gap(booted, ready), gap(ready, nxt)])
    return rows


def run(ctx) -> Section:
    sec = Section("rollout", "Rolling reboot of 5 nodes over the machines' own reboot and kubelet delays",
                  aim=f"ConfigRollout wall ≤ {AIM} × the time the machines were away (reboot to Node Ready)")
    work = ctx.out / "rollout"
    shutil.rmtree(work, ignore_errors=True)
    lab = labctl.BenchLab(5, work / "lab", log=ctx.log)
    zs = None
    try:
        lab.up()
        zs = labctl.new_zone_stack(lab, 0, work, "rollout")
        common.write_config(zs.stack, _config(lab, []))
        up = runs.timed_pulumi(zs.stack, "up", "--yes", "--skip-preview", timeout=UP_TIMEOUT)
        if not up.ok:
            sec.not_measured(f"the zone did not come up: {up.tail(15)}")
            return sec
        for a in lab.addresses[:5]:
            control.set_faults(a, reboot_delay=REBOOT, kubelet_delay=KUBELET)
        common.write_config(zs.stack, _config(lab, [PATCH]))
        r = runs.timed_pulumi(zs.stack, "up", "--yes", "--skip-preview", timeout=UP_TIMEOUT,
                              event_log=work / "rollout-events.jsonl")
        seconds = rollout_seconds(r.events)
        if not r.ok or seconds is None:
            sec.not_measured(f"the rolling reboot failed: {r.tail(15)}")
            return sec
        floor = 5 * (REBOOT + KUBELET)
        times = node_times(lab.addresses[:5])
        away = away_seconds(times)
        if away is None:
            sec.not_measured(f"the lab's events miss a node's reboot or Node Ready: {times}")
            return sec
        ratio = seconds / away
        sec.runs = 1
        sec.table(["reboot delay", "kubelet delay", "machines away (5 nodes)", "ConfigRollout wall",
                   "whole `pulumi up`", "ratio", "over 5 × (R + K)"],
                  [[f"{REBOOT:g} s", f"{KUBELET:g} s", f"{away:.1f} s", f"{seconds:.1f} s", f"{r.wall:.1f} s",
                    f"{ratio:.2f}", f"{seconds / floor:.2f}"]])
        sec.verdict(ratio <= AIM, f"ratio {ratio:.2f} (aim ≤ {AIM})")
        sec.table(["node", "apply → down", "down → booted", "booted → Node Ready", "Ready → next node's apply"],
                  node_phases(times))
        sec.note("Machines away: per node, its reboot to its Node Ready on the new boot (lab events): the reboot "
                 "delay, the emulator's boot, the kubelet delay and the Cilium agent's way back (the DaemonSet "
                 "replaces the pod the shutdown ended, kwok runs it, the Node turns Ready). The rest is the "
                 "rollout's own: cordon and drain, the apply, the readiness gate's polling (0.2–0.5 s), the etcd "
                 "gates on control planes, uncordon.")
    except Exception as e:  # noqa: BLE001 - reported in the section
        sec.not_measured(f"{type(e).__name__}: {e}")
    finally:
        if zs is not None:
            zs.stack.run("stack", "rm", "--yes", "--force", "--stack", zs.stack.name, timeout=120, check=False)
        lab.down()
    return sec
