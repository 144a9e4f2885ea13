"""`python -m kontinuum restore --stack S --zone Z --snapshot FILE|S3-URL [--force] [--dry-run]`:
Talos's etcd disaster recovery for one zone from a file `backup` wrote (kontinuum/backup/
restore.py): everything about the file is checked first, a healthy etcd is refused unless
--force, the plan is printed before anything is done, and running it again resumes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", "-s", required=True, help="the stack (region)")
    parser.add_argument("--zone", "-z", required=True, help="the zone, as in kontinuum:zones")
    parser.add_argument("--snapshot", required=True, help="a file written by `python -m kontinuum backup`: its path "
                        "or its s3://<bucket>/<key>?endpoint=… URL")
    parser.add_argument("--cwd", "-C", type=Path, default=None, help="the Pulumi project folder (default: here)")
    parser.add_argument("--force", action="store_true", help="restore even though the zone's etcd is healthy")
    parser.add_argument("--dry-run", action="store_true", help="check the file and the zone, print the plan, do nothing")
    parser.add_argument("--config-file", type=Path, default=None,
                        help="the stack config whose `lost: true` machines are left out (default: "
                             "<stackConfigDir>/Pulumi.<stack>.yaml of the project folder)")


def run(args: argparse.Namespace) -> int:
    from kontinuum.backup.restore import restore
    from kontinuum.backup.store import for_file
    from kontinuum.backup.stack_state import zone_access
    from kontinuum.errors import KontinuumError
    from kontinuum.recover import export

    cwd = (args.cwd or Path.cwd()).resolve()
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    try:
        exported = export(args.stack, cwd, show_secrets=True)
        if exported is None:
            log(f"restore: stack {args.stack} does not exist")
            return 1
        access, _ = zone_access(exported.get("deployment") or {}, args.stack, args.zone)
        store, name = for_file(args.snapshot)
        with store.local(name) as path:  # a bucket's file: a private local copy, removed afterwards
            restore(access, path, force=args.force, dry_run=args.dry_run, log=log,
                    lost=lost_machines(args.config_file or stack_file(cwd, args.stack), args.zone))
    except KontinuumError as e:
        log(f"restore: {e}")
        return 1
    return 0


def stack_file(cwd: Path, stack: str) -> Path:
    import yaml

    project = yaml.safe_load((cwd / "Pulumi.yaml").read_text()) if (cwd / "Pulumi.yaml").exists() else {}
    return cwd / str((project or {}).get("stackConfigDir") or ".") / f"Pulumi.{stack}.yaml"


def lost_machines(path: Path, zone: str) -> frozenset[str]:
    """Addresses the stack config declares lost in `zone` (`talosAddresses[].lost`): the restore
    leaves them out. Read from the stack file itself, so a config the program refuses (two of
    three control planes lost) still says which machines are gone; no file, none lost."""
    from kontinuum.stackconfig.validation import read_stack_file

    if not path.exists():
        return frozenset()
    raw, _ = read_stack_file(path)
    lost = set()
    for z in raw.get("zones") or []:
        if isinstance(z, dict) and z.get("zone") == zone:
            for m in z.get("talosAddresses") or []:
                if isinstance(m, dict) and m.get("lost") is True:
                    lost.update(m.get("addresses") or [m.get("address")])
    return frozenset(a for a in lost if a)
