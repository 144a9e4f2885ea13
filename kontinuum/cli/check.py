"""`python -m kontinuum check stacks/Pulumi.<stack>.yaml…`: the program's own stack-config
validation without an engine (pre-commit, CI): the same messages, exit 0 when valid, 1 when not."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kontinuum.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stack_files", nargs="+", type=Path, metavar="stacks/Pulumi.<stack>.yaml")
    parser.add_argument("--no-render", action="store_true",
                        help="skip rendering the machine configs (contract checks only)")


def run(args: argparse.Namespace) -> int:
    from kontinuum.stackconfig import validation  # the contract, imported only when checking

    failed = 0
    for path in args.stack_files:
        try:
            raw, secret_keys = validation.read_stack_file(path)
            result = validation.validate(raw, secret_keys=secret_keys, render=not args.no_render)
        except OSError as e:
            print(f"{path}: cannot read ({e.strerror})", file=sys.stderr)
            failed += 1
            continue
        except (ConfigError, ValueError) as e:  # not YAML, or no `config:` mapping
            print(f"{path}: {e}", file=sys.stderr)
            failed += 1
            continue
        for note in result.notes:
            print(f"{path}: note: {note}", file=sys.stderr)
        if result.errors:
            failed += 1
            print(f"{path}: invalid stack config (kontinuum:…):", file=sys.stderr)
            print(result.message(), file=sys.stderr)
        else:
            zones = len(result.stack.zones) if result.stack else 0
            print(f"{path}: ok ({zones} zone{'s' * (zones != 1)}, {result.configs} machine configs rendered and "
                  f"validated)")
    return 1 if failed else 0
