"""`python -m kontinuum migrate [--stack S] [--cwd DIR] [--dry-run]`: move a stack made by an
earlier Kontinuum to the current resource layout (kontinuum/state_migrations.py) with the
engine's `pulumi state rename`; no node or cluster is contacted. Safe to run again: a moved
stack has nothing left to move. `recover` (which tools/pulumi runs before every up and destroy)
runs it too, on the export it already made."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", "-s", help="the stack (default: the selected one)")
    parser.add_argument("--cwd", "-C", type=Path, default=None, help="the Pulumi project folder (default: here)")
    parser.add_argument("--dry-run", action="store_true", help="print the moves, make none")


def run(args: argparse.Namespace) -> int:
    from kontinuum.recover import RecoverError, current_export, export, selected_stack

    cwd = (args.cwd or Path.cwd()).resolve()
    try:
        stack = args.stack or selected_stack(cwd)
        exported = current_export(stack, cwd) if stack else export(None, cwd)  # none selected: the engine says so
    except RecoverError as e:
        print(f"migrate: {e}", file=sys.stderr)
        return 1
    return migrate(args.stack, cwd, exported, dry_run=args.dry_run)


def migrate(stack: str | None, cwd: Path, exported: dict | None, *, dry_run: bool = False) -> int:
    """Carry out the moves an export of `stack` needs; returns the exit code."""
    from kontinuum.recover import engine, stack_args
    from kontinuum.state_migrations import member_renames

    if exported is None:
        return 0
    renames, unmatched = member_renames(exported.get("deployment") or {})
    for line in unmatched:
        print(f"migrate: not moved, move it by hand or remove it: {line}", file=sys.stderr)
    for r in renames:
        print(f"migrate: {r.urn.rsplit('::', 1)[-1]} → {r.new_name} (the same machine, now named after it)",
              file=sys.stderr)
        if dry_run:
            continue
        done = engine("state", "rename", "--yes", *stack_args(stack), r.urn, r.new_name, cwd=cwd)
        if done.returncode != 0:
            print(f"migrate: `pulumi state rename` failed: {done.stderr.strip()[-800:]}", file=sys.stderr)
            return 1
    return 1 if unmatched else 0
