"""`python -m kontinuum rollout --waves a/b,c | --fleet fleet.yaml`: `pulumi up` region stack by
region stack in waves (kontinuum/rollout_plan.py, rollout_runner.py). Regions of a wave run in
parallel up to --parallel; the next wave starts only once every zone of this one is ready and
stayed healthy for the soak. The first failure stops the rollout; a re-run resumes.

Exit codes as `preview --all`'s (README): 0 done (with --preview: no changes); 2 (--preview
only) changes; 3 invalid input, nothing started (fleet file, unknown stack, a stack file that
fails the contract or has no stack in the backend); 4 a failure (an up, the health gate, the
backend, another rollout holding the progress file).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kontinuum.cli.preview import CODES, FAILED, INVALID, NO_CHANGES, ROOT
from kontinuum.preview_summary import RegionSummary
from kontinuum import rollout_plan as rp
from kontinuum.rollout_report import RegionOutcome, WaveOutcome, invalid_markdown, plan_markdown, run_markdown

DEFAULTS = {"parallel": 2, "soak": 300.0, "timeout": 3600.0, "readyTimeout": 900.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--waves", help="stacks in waves: waves separated by '/', stacks of a wave by ',' "
                                       "(e.g. dev/staging-eu,staging-us/eu,us)")
    which.add_argument("--fleet", type=Path, help="a fleet file with the waves in order (README, \"Staged rollouts\")")
    parser.add_argument("--preview", action="store_true", help="print the plan: each wave's regions with their "
                        "change summary, or why they are skipped; changes nothing")
    parser.add_argument("--stacks-dir", type=Path, help="where the stack files are (default: stacks/)")
    parser.add_argument("--state", type=Path, help="the progress file (default: <fleet>.state.json beside the "
                        "fleet file; with --waves .state/rollout.json)")
    parser.add_argument("--restart", action="store_true", help="forget the progress: roll out every region again")
    parser.add_argument("--parallel", type=int, help="regions of a wave at once (default 2)")
    parser.add_argument("--soak", type=float, help="seconds every zone of a wave must stay healthy before the "
                        "next wave starts (default 300)")
    parser.add_argument("--timeout", type=float, help="seconds one region's `pulumi up` may take (default 3600)")
    parser.add_argument("--ready-timeout", type=float, help="seconds a wave's zones have to become healthy after "
                        "its ups (default 900)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between health probes (default 10)")
    parser.add_argument("--probe-timeout", type=float, default=10.0,
                        help="seconds per call to a node or API while probing (default 10)")
    parser.add_argument("--cluster-timeout", type=float, default=5.0,
                        help="--preview: seconds the Kubernetes provider may wait per cluster request (default 5)")
    parser.add_argument("--backend-timeout", type=float, default=60.0,
                        help="seconds the state backend has to list the stacks (default 60)")
    parser.add_argument("--logs", type=Path, help="keep each region's whole `pulumi up` output (its JSON events "
                        "and stderr) in DIR/<stack>.log, 0600, replaced by the region's next up")
    parser.add_argument("--markdown", type=Path, help="write the Markdown report here (default: stdout)")
    parser.add_argument("--json", type=Path, help="write the JSON report here")


def settings(args: argparse.Namespace) -> tuple[list[rp.Wave], dict]:
    """The waves and every bound: flags over the fleet file over the defaults."""
    fleet = rp.load_fleet(args.fleet) if args.fleet else rp.Fleet(rp.parse_waves(args.waves))
    s = {**DEFAULTS, **fleet.settings}
    for key, flag in (("parallel", args.parallel), ("soak", args.soak), ("timeout", args.timeout),
                      ("readyTimeout", args.ready_timeout)):
        if flag is not None:
            s[key] = flag
    s["stacksDir"] = args.stacks_dir or s.get("stacksDir") or ROOT / "stacks"
    default_state = args.fleet.with_name(args.fleet.stem + ".state.json") if args.fleet else \
        ROOT / ".state" / "rollout.json"
    s["state"] = args.state or s.get("state") or default_state
    s["logs"] = args.logs or s.get("logs")
    if s["parallel"] < 1:
        raise rp.FleetError(f"--parallel {s['parallel']}: at least 1")
    return fleet.waves, s


def precheck(waves: list[rp.Wave], s: dict, args: argparse.Namespace) -> tuple[dict, list[RegionSummary]]:
    """stack → (file, region, zones) for every stack of the plan, or the problems: no stack
    file, the contract, not in the backend. Nothing is started while any is wrong."""
    from kontinuum.cli.preview import offline_check
    from kontinuum.preview_runner import list_stacks

    names = [n for w in waves for n in w.stacks]
    files, problems = {}, []
    for name in names:
        path = Path(s["stacksDir"]) / f"Pulumi.{name}.yaml"
        if path.exists():
            files[name] = path
        else:
            problems.append(RegionSummary(stack=name, status="invalid", error=f"unknown stack {name!r}: there is no "
                                          f"{path}"))
    found = {}
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(files)))) as pool:
        for name, (bad, region, zones) in zip(files, pool.map(lambda i: offline_check(*i), files.items())):
            if bad:
                problems.append(bad)
            else:
                found[name] = (files[name], region, zones)
    if problems or not found:
        return found, problems
    existing, why = list_stacks(timeout=args.backend_timeout)
    if existing is None:
        return found, [RegionSummary(stack=n, region=r, status="failed", error=why) for n, (_, r, _) in found.items()]
    for name in [n for n in found if n not in existing]:
        problems.append(RegionSummary(stack=name, region=found[name][1], status="invalid", error=(
            f"stack {name!r} ({found[name][0]}) does not exist in the state backend: `tools/pulumi stack init "
            f"{name}` first")))
    return found, problems


def run(args: argparse.Namespace) -> int:
    try:
        waves, s = settings(args)
    except rp.FleetError as e:
        print(f"rollout: {e}", file=sys.stderr)
        return INVALID
    found, problems = precheck(waves, s, args)
    if problems:
        _write(args, invalid_markdown(problems), {"problems": [p.to_json() for p in problems]})
        for p in problems:
            print(f"rollout: stack {p.stack}: {p.status}: {(p.error or '').splitlines()[0]}", file=sys.stderr)
        return max(CODES[p.status] for p in problems)
    state_path = Path(s["state"])
    if args.preview:  # reads the progress, writes nothing: no lock
        prepared = prepare(waves, found, s, state_path, args)
        return prepared if isinstance(prepared, int) else preview_plan(prepared[0], prepared[1], found, s, args)
    state_path.parent.mkdir(parents=True, exist_ok=True)
    with open(state_path.with_name(state_path.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file closes (or we die)
        except BlockingIOError:
            print(f"rollout: another rollout is running with the progress file {state_path}; wait for it",
                  file=sys.stderr)
            return FAILED
        prepared = prepare(waves, found, s, state_path, args)
        if isinstance(prepared, int):
            return prepared
        plans, soaks, state, fps = prepared
        outcomes = execute(plans, soaks, found, state, state_path, fps, s, args)
    _write(args, run_markdown(outcomes, state_path=str(state_path)),
           {"state": str(state_path), "waves": [w.to_json() for w in outcomes]})
    failed = [w for w in outcomes if w.status in ("failed", "unhealthy")]
    for w in failed:
        for r in w.regions:
            if r.status == "failed":
                print(f"rollout: {w.name}: stack {r.stack}: up failed: {(r.errors or ['?'])[0].splitlines()[0]}",
                      file=sys.stderr)
        if w.status == "unhealthy":
            print(f"rollout: {w.name}: the health gate failed: {w.gate.splitlines()[0]}", file=sys.stderr)
    return FAILED if failed else NO_CHANGES


def prepare(waves: list[rp.Wave], found: dict, s: dict, state_path: Path, args) -> int | tuple:
    """(plans, soaks, progress, fingerprints), or the exit code of an unreadable progress file."""
    try:
        state = {"version": 1, "regions": {}} if args.restart else rp.load_state(state_path)
    except rp.FleetError as e:
        print(f"rollout: {e}", file=sys.stderr)
        return INVALID
    program = rp.program_digest()
    fps = {n: rp.fingerprint(f, program) for n, (f, _, _) in found.items()}
    soaks = [w.soak if w.soak is not None else float(s["soak"]) for w in waves]
    return rp.plan(waves, state, fps), soaks, state, fps


def preview_plan(plans: list[rp.WavePlan], soaks: list[float], found: dict, s: dict, args) -> int:
    from kontinuum.cli.preview import preview_one

    todo = [st.stack for p in plans for st in p.steps if st.run]
    ns = argparse.Namespace(refresh=False, cluster_timeout=args.cluster_timeout, timeout=float(s["timeout"]))
    with ThreadPoolExecutor(max_workers=max(1, int(s["parallel"]))) as pool:
        summaries = dict(zip(todo, pool.map(lambda n: preview_one(n, found[n][0], found[n][1], found[n][2], ns), todo)))
    _write(args, plan_markdown(plans, summaries, soaks),
           {"waves": [{"name": p.wave.name, "soak": soak, "gate": p.gate,
                       "regions": [{"stack": st.stack, "run": st.run, "why": st.why,
                                    "preview": summaries[st.stack].to_json() if st.stack in summaries else None}
                                   for st in p.steps]} for p, soak in zip(plans, soaks)]})
    for sm in summaries.values():
        if sm.status in ("invalid", "failed"):
            print(f"rollout: stack {sm.stack}: {sm.status}: {(sm.error or '').splitlines()[0]}", file=sys.stderr)
    return max((CODES[sm.status] for sm in summaries.values()), default=NO_CHANGES)


def execute(plans, soaks, found, state, state_path: Path, fps, s, args) -> list[WaveOutcome]:
    """Wave after wave: the ups, then the gate; the progress file is written after each region."""
    from kontinuum import rollout_runner

    run = _Run(found, state, state_path, fps, s)
    outcomes = [WaveOutcome(p.wave.name, soak) for p, soak in zip(plans, soaks)]
    for p, out in zip(plans, outcomes):
        out.regions = [RegionOutcome(st.stack, "skipped", st.why) if not st.run else
                       RegionOutcome(st.stack, "not-started", f"not started ({st.why})") for st in p.steps]
    for p, out in zip(plans, outcomes):
        _log(f"{p.wave.name}: " + ", ".join(f"{st.stack} ({'up' if st.run else 'skipped'})" for st in p.steps))
        if not run.ups(p, out):
            out.status = "failed"
            return outcomes
        if p.gate:
            out.gate = rollout_runner.gate(p.wave.stacks, ready_timeout=float(s["readyTimeout"]), soak=out.soak,
                                           interval=args.interval, probe_timeout=args.probe_timeout, log=_log)
            if out.gate:
                out.status = "unhealthy"
                state["stopped"] = {"wave": p.wave.name, "why": out.gate}
                rp.save_state(state_path, state)
                return outcomes
        else:
            out.gate = "skipped"
        for st in p.steps:
            if st.run or state["regions"][st.stack].get("status") != rp.HEALTHY:
                rp.record(state, st.stack, rp.HEALTHY, fps[st.stack])
        state.pop("stopped", None)
        rp.save_state(state_path, state)
        out.status = "done"
    return outcomes


class _Run:
    """One wave's ups, at most `parallel` at once; after the first failure no other starts."""

    def __init__(self, found, state, state_path: Path, fps, s):
        self.found, self.state, self.state_path, self.fps, self.s = found, state, state_path, fps, s
        self.saving = threading.Lock()
        self.stop = threading.Event()

    def ups(self, p: rp.WavePlan, out: WaveOutcome) -> bool:
        self.stop.clear()
        regions = {r.stack: r for r in out.regions}
        with ThreadPoolExecutor(max_workers=max(1, int(self.s["parallel"]))) as pool:
            list(pool.map(lambda stack: self.one(stack, regions[stack]), p.to_run))
        return not self.stop.is_set()

    def one(self, stack: str, region: RegionOutcome) -> None:
        from kontinuum import rollout_runner

        if self.stop.is_set():
            region.why = "not started: another region of this wave failed"
            return
        _log(f"{stack}: pulumi up")
        result = rollout_runner.up(stack, self.found[stack][0].resolve(), timeout=float(self.s["timeout"]),
                                   log_dir=self.s.get("logs"))
        region.seconds, region.counts, region.errors = result.seconds, result.counts, result.errors
        region.status, region.why = ("done" if result.ok else "failed"), ""
        _log(f"{stack}: up {'done' if result.ok else 'FAILED'} in {result.seconds:.0f} s")
        with self.saving:
            rp.record(self.state, stack, rp.APPLIED if result.ok else rp.FAILED,
                      self.fps[stack] if result.ok else None, error="\n".join(result.errors) or None)
            rp.save_state(self.state_path, self.state)
        if not result.ok:
            self.stop.set()  # the first failure: no other region of the wave starts


def _log(text: str) -> None:
    print(f"rollout: {text}", file=sys.stderr, flush=True)


def _write(args: argparse.Namespace, text: str, doc: dict) -> None:
    if args.markdown:
        args.markdown.write_text(text)
    else:
        sys.stdout.write(text)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
