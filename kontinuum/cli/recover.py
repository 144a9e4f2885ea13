"""`python -m kontinuum recover [--stack S] [--cwd DIR]`: settle what a killed `pulumi up` or
`pulumi destroy` left (a stale lock, pending operations, Helm release records), then move a
stack made by an earlier Kontinuum to the current layout (`migrate`), on one export of the
state, so that the next run converges without a person. tools/pulumi runs it before every up
and destroy; the rules are in kontinuum/recover.py and kontinuum/state_migrations.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", "-s", help="the stack (default: the selected one)")
    parser.add_argument("--cwd", "-C", type=Path, default=None, help="the Pulumi project folder (default: here)")


def run(args: argparse.Namespace) -> int:
    from kontinuum.cli.migrate import migrate
    from kontinuum.recover import RecoverError, recover

    cwd = (args.cwd or Path.cwd()).resolve()
    try:
        exported = recover(args.stack, cwd)
    except RecoverError as e:
        print(f"recover: {e}", file=sys.stderr)
        return 1
    if migrate(args.stack, cwd, exported) != 0:
        print("recover: the stack could not be moved to this version's layout (above)", file=sys.stderr)
        return 1
    return 0
