"""`python -m kontinuum backup --stack S --zone Z [--cwd DIR] [--directory D] [--keep N]`: take
one etcd snapshot of a zone through Talos's EtcdSnapshot, checked and encrypted with the
zone's backup key, into `<directory>/<stack>/<region>-<zone>/` (README: etcd backup and
restore). Reads the zone's credentials from the stack's state; prints the file's path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", "-s", required=True, help="the stack (region)")
    parser.add_argument("--zone", "-z", required=True, help="the zone, as in kontinuum:zones")
    parser.add_argument("--cwd", "-C", type=Path, default=None, help="the Pulumi project folder (default: here)")
    parser.add_argument("--directory", type=Path, help="backup directory (default: the zone's backup.directory)")
    parser.add_argument("--keep", type=int, help="newest files kept (default: the zone's backup.keep)")


def run(args: argparse.Namespace) -> int:
    from kontinuum.backup.files import DEFAULT_DIRECTORY, DEFAULT_KEEP, zone_directory
    from kontinuum.backup.stack_state import zone_access
    from kontinuum.backup.take import take
    from kontinuum.errors import KontinuumError
    from kontinuum.recover import export

    cwd = (args.cwd or Path.cwd()).resolve()
    try:
        exported = export(args.stack, cwd, show_secrets=True)
        if exported is None:
            print(f"backup: stack {args.stack} does not exist", file=sys.stderr)
            return 1
        access, settings = zone_access(exported.get("deployment") or {}, args.stack, args.zone)
        directory = args.directory or (settings.directory if settings else cwd / DEFAULT_DIRECTORY)
        keep = args.keep or (settings.keep if settings else DEFAULT_KEEP)
        taken = take(access, zone_directory(directory, args.stack, access.cluster), keep=keep,
                     log=lambda m: print(m, file=sys.stderr))
    except KontinuumError as e:
        print(f"backup: {e}", file=sys.stderr)
        return 1
    print(f"backup: {access.cluster}: {taken.size} bytes from {taken.node}, etcd sha256 {taken.sha256}", file=sys.stderr)
    for p in taken.pruned:
        print(f"backup: removed {p} (keeping the newest {keep})", file=sys.stderr)
    print(taken.path)
    return 0
