"""The operator CLI: `python -m kontinuum <command>`. A small dispatcher; each command lives in
its own module and adds itself to COMMANDS with (help, add_arguments, run)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _recover_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", "-s", help="the stack (default: the selected one)")
    p.add_argument("--cwd", "-C", type=Path, default=Path.cwd(), help="the Pulumi project folder (default: here)")


def _recover(args: argparse.Namespace) -> int:
    from kontinuum.recover import RecoverError, recover

    try:
        recover(args.stack, args.cwd.resolve())
    except RecoverError as e:
        print(f"recover: {e}", file=sys.stderr)
        return 1
    return 0


# name -> (help, add_arguments, run)
COMMANDS = {
    "recover": ("settle what a killed `pulumi up`/`destroy` left (stale lock, pending operations, Helm records); "
                "tools/pulumi runs it before every up and destroy", _recover_args, _recover),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kontinuum", description="The Kontinuum operator CLI.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_, add_arguments, _) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_, description=help_))
    args = parser.parse_args(argv)
    return COMMANDS[args.command][2](args)


if __name__ == "__main__":
    sys.exit(main())
