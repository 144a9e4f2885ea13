"""`python -m kontinuum preview --all | --stack S…`: every region stack previewed (bounded, in
parallel), a Markdown summary per region for a merge-request comment and a JSON form.

Exit codes (documented in README, used by ci/): 0 no changes; 2 changes (with
--expect-no-changes: drift); 3 invalid input (a stack file that does not parse or fails the
contract, an unknown stack name, a stack file with no stack in the backend); 4 an engine or
backend failure (including a backend that does not answer within --backend-timeout). When
several stacks differ, the highest applies.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from kontinuum.preview_summary import RegionSummary, report

ROOT = Path(__file__).resolve().parents[2]
NO_CHANGES, CHANGES, INVALID, FAILED = 0, 2, 3, 4
CODES = {"no-changes": NO_CHANGES, "changes": CHANGES, "invalid": INVALID, "failed": FAILED}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every stacks/Pulumi.<stack>.yaml")
    which.add_argument("--stack", "-s", action="append", help="this stack (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], help="leave this stack out of --all (repeatable)")
    parser.add_argument("--stacks-dir", type=Path, default=ROOT / "stacks", help="where the stack files are")
    parser.add_argument("--refresh", action="store_true", help="refresh first (reads nodes and clusters: drift)")
    parser.add_argument("--expect-no-changes", action="store_true",
                        help="a drift job: any change is drift (exit 2, summary says drift)")
    parser.add_argument("--parallel", type=int, default=2, help="stacks previewed at once (default 2)")
    parser.add_argument("--cluster-timeout", type=float, default=5.0,
                        help="seconds the Kubernetes provider may wait per cluster request (default 5)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per stack preview (default 900)")
    parser.add_argument("--backend-timeout", type=float, default=60.0,
                        help="seconds the state backend has to list the stacks (default 60)")
    parser.add_argument("--markdown", type=Path, help="write the Markdown summary here (default: stdout)")
    parser.add_argument("--json", type=Path, help="write the JSON summary here")


def stack_files(args: argparse.Namespace) -> tuple[dict[str, Path], list[RegionSummary]]:
    """Stack name → its file; unknown names come back as invalid summaries."""
    found = {p.name[len("Pulumi."):-len(".yaml")]: p for p in sorted(args.stacks_dir.glob("Pulumi.*.yaml"))}
    if args.all:
        return {n: p for n, p in found.items() if n not in args.exclude}, []
    chosen, bad = {}, []
    for name in args.stack:
        if name in found:
            chosen[name] = found[name]
        else:
            bad.append(RegionSummary(stack=name, status="invalid", error=(
                f"unknown stack {name!r}: there is no {args.stacks_dir}/Pulumi.{name}.yaml "
                f"(known: {', '.join(found) or 'none'})")))
    return chosen, bad


def offline_check(name: str, path: Path) -> tuple[RegionSummary | None, str | None, list[str]]:
    """(invalid summary or None, region, zones) from the program's own validation, no engine."""
    from kontinuum.errors import ConfigError
    from kontinuum.stackconfig import validation

    try:
        raw, secret_keys = validation.read_stack_file(path)
        result = validation.validate(raw, secret_keys=secret_keys, render=True)
    except OSError as e:
        return RegionSummary(stack=name, status="invalid", error=f"{path}: cannot read ({e.strerror})"), None, []
    except (ConfigError, ValueError) as e:
        return RegionSummary(stack=name, status="invalid", error=f"{path}: {e}"), None, []
    if result.errors:
        return RegionSummary(stack=name, region=raw.get("region"), status="invalid",
                             error=f"{path}: invalid stack config (kontinuum:…):\n{result.message()}"), None, []
    stack = result.stack
    return None, stack.region, [z.zone for z in stack.zones]


def api_endpoints(path: Path) -> dict[str, str]:
    """zone → its Kubernetes API URL (the endpoint, or the first control plane's :6443), and
    `hub` → the hub's when its kubeconfig is a file (a secret one is not read here)."""
    from kontinuum.stackconfig import validation

    raw, secret_keys = validation.read_stack_file(path)
    stack = validation.validate(raw, secret_keys=secret_keys, render=False).stack
    out = {}
    for z in stack.zones if stack else ():
        cps = [m for m in z.machines if m.pool == z.control_plane.name]
        if z.endpoint or cps:
            out[z.zone] = z.endpoint or f"https://{cps[0].addresses[0]}:6443"
    hub_file = raw.get("hubKubeconfigFile")
    if isinstance(hub_file, str):
        try:
            doc = yaml.safe_load((ROOT / hub_file).read_text())
            out["hub"] = doc["clusters"][0]["cluster"]["server"]
        except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError):
            pass  # no lab running: the probe of the zones still tells
    return out


def preview_one(name: str, path: Path, region: str, zones: list[str], args: argparse.Namespace) -> RegionSummary:
    from kontinuum import preview_runner
    from kontinuum.preview_summary import summarize

    run = preview_runner.preview(name, path.resolve(), refresh=args.refresh, cluster_timeout=args.cluster_timeout,
                                 timeout=args.timeout)
    if run.plan is None:
        text = "\n".join(run.errors)
        status = "invalid" if "invalid stack config" in text else "failed"
        return RegionSummary(stack=name, region=region, status=status, error=text)
    summary = summarize(name, run.plan, region=region, zones=zones)
    deployed = {k: v for k, v in api_endpoints(path).items() if k not in summary.zones_added}
    silent = preview_runner.unanswered(deployed, args.cluster_timeout)
    if silent:
        summary.cluster_compared = False
        summary.notes.append("not compared with the live cluster (no answer within "
                             f"{args.cluster_timeout:g} s): {', '.join(silent)}")
    return summary


def previews(files: dict[str, Path], args: argparse.Namespace) -> list[RegionSummary]:
    """Offline checks first (no engine, no backend), then one engine preview per valid stack
    that exists in the backend."""
    from kontinuum import preview_runner

    out, valid = [], {}
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        for name, (bad, region, zones) in zip(files, pool.map(lambda i: offline_check(*i), files.items())):
            if bad:
                out.append(bad)
            else:
                valid[name] = (files[name], region, zones)
    if not valid:
        return out
    existing, why = preview_runner.list_stacks(timeout=args.backend_timeout)
    if existing is None:
        return out + [RegionSummary(stack=n, region=r, status="failed", error=why) for n, (_, r, _) in valid.items()]
    for name in [n for n in valid if n not in existing]:
        path, region, _ = valid.pop(name)
        out.append(RegionSummary(stack=name, region=region, status="invalid", error=(
            f"stack {name!r} ({path}) does not exist in the state backend: `tools/pulumi stack init {name}` "
            f"first, or leave it out (--exclude {name})")))
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        out += list(pool.map(lambda item: preview_one(item[0], *item[1], args), valid.items()))
    return out


def run(args: argparse.Namespace) -> int:
    files, summaries = stack_files(args)
    if not files and not summaries:
        print(f"preview: no stack files in {args.stacks_dir}", file=sys.stderr)
        return INVALID
    summaries += previews(files, args)
    summaries.sort(key=lambda s: s.stack)
    text = report(summaries, drift=args.expect_no_changes)
    if args.markdown:
        args.markdown.write_text(text)
    else:
        print(text)
    if args.json:
        args.json.write_text(json.dumps({"drift": args.expect_no_changes,
                                         "regions": [s.to_json() for s in summaries]}, indent=2))
    for s in summaries:
        if s.status in ("invalid", "failed"):
            print(f"preview: stack {s.stack}: {s.status}: {(s.error or '').splitlines()[0]}", file=sys.stderr)
        elif s.changed and args.expect_no_changes:
            print(f"preview: stack {s.stack}: drift: {', '.join(_drift_names(s))}", file=sys.stderr)
    return max((CODES[s.status] for s in summaries), default=NO_CHANGES)


def _drift_names(s: RegionSummary) -> list[str]:
    nodes = [f"{n.zone}/{n.node}" for n in (*s.nodes_reset, *s.nodes_joining, *s.configs_changed)]
    return nodes or s.zones_changed or s.zones_added or s.zones_removed or ["changes"]
