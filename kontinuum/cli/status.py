"""`python -m kontinuum status --all | --stack S… [--json FILE] [--markdown FILE]`: how every zone
is doing between runs, read-only and bounded (kontinuum/status_probe.py, fleet_status.py).

Exit codes (README; for an alerting job): 0 fine; 1 warning (a version other than configured, a
credential within certificates.renewBefore, no backup or one older than --backup-max-age);
2 unhealthy (a node, etcd or the API down, a Node not Ready, a credential expired); 3 unreachable
(no node of a zone answers, or a stack's state cannot be read). The highest applies.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from kontinuum.cli.preview import ROOT

UNREACHABLE = 3
DEFAULT_RENEW_DAYS = 30.0  # certificates.renewBefore's default, for a zone whose state does not record it


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every stacks/Pulumi.<stack>.yaml")
    which.add_argument("--stack", "-s", action="append", help="this stack (repeatable)")
    parser.add_argument("--stacks-dir", type=Path, default=ROOT / "stacks", help="where the stack files are")
    parser.add_argument("--cwd", "-C", type=Path, default=None, help="the Pulumi project folder (default: here)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per call to a node or API (default 10)")
    parser.add_argument("--renew-before", type=float, default=None,
                        help="days before expiry that count as a warning (default: each zone's "
                             "certificates.renewBefore as its last up recorded it, else 30)")
    parser.add_argument("--backup-max-age", type=float, default=26.0,
                        help="hours after which the newest backup counts as old (default 26: a daily job)")
    parser.add_argument("--markdown", type=Path, help="write the Markdown summary here (default: stdout)")
    parser.add_argument("--json", type=Path, help="write the JSON form here")


def _stacks(args: argparse.Namespace) -> list[str]:
    if args.all:
        return [p.name[len("Pulumi."):-len(".yaml")] for p in sorted(args.stacks_dir.glob("Pulumi.*.yaml"))]
    return list(args.stack)


def status_of(stack: str, args: argparse.Namespace, now: dt.datetime) -> tuple[dict, str, int]:
    """(JSON form, Markdown, level) of one stack."""
    from kontinuum import fleet_status as fs
    from kontinuum.recover import export
    from kontinuum.status_probe import observe_stack

    try:
        exported = export(stack, (args.cwd or Path.cwd()).resolve(), show_secrets=True)
        if exported is None:
            raise LookupError(f"stack {stack} does not exist in the backend")
        region, seen = observe_stack(exported.get("deployment") or {}, stack, timeout=args.timeout, now=now)
    except Exception as e:  # noqa: BLE001 - a stack that cannot be read is reported, the others still are
        text = f"{type(e).__name__}: {e}"
        return {"stack": stack, "error": text}, fs.markdown(stack, None, [], now=now, error=text), UNREACHABLE
    zones, errors = [], []
    for item in seen:
        if isinstance(item, tuple):
            errors.append(f"zone {item[0]}: {item[1]}")
        else:
            days = args.renew_before if args.renew_before is not None else item.renew_before_days or DEFAULT_RENEW_DAYS
            zones.append(fs.judge(item, now=now, renew_before=dt.timedelta(days=days),
                                  backup_max_age=dt.timedelta(hours=args.backup_max_age)))
    level = max([z.level for z in zones] + [UNREACHABLE] * len(errors), default=fs.FINE)
    text = fs.markdown(stack, region, zones, now=now) + "".join(f"- {e}\n" for e in errors)
    return {"stack": stack, "region": region, "state": fs.LEVELS[level], "zones": [z.to_json() for z in zones],
            "errors": errors}, text, level


def run(args: argparse.Namespace) -> int:
    now = dt.datetime.now(dt.timezone.utc)
    results = [status_of(stack, args, now) for stack in _stacks(args)]
    text = "## Kontinuum status\n\n" + "\n".join(md for _, md, _ in results)
    if args.markdown:
        args.markdown.write_text(text)
    else:
        sys.stdout.write(text)
    if args.json:
        args.json.write_text(json.dumps([j for j, _, _ in results], indent=2) + "\n")
    return max((level for _, _, level in results), default=0)
