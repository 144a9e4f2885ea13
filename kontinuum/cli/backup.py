"""`python -m kontinuum backup --stack S --zone Z [--destination D] [--keep N] [--verify]`: take
one etcd snapshot of a zone through Talos's EtcdSnapshot with the zone's os:etcd:backup
credential, checked and encrypted with the zone's backup key, into
`<destination>/<stack>/<region>-<zone>/` (a folder or an s3:// bucket); with --verify, then
prove it restores (kontinuum/backup/verify.py).

`python -m kontinuum backup verify <file or s3:// URL> --stack S --zone Z`: prove an existing
backup restores. Either way the result is recorded beside the file (`<name>.verified.json`).
Reads the zone's key and credential from the stack's state; prints the file's path or URL.

With `--kit FILE` (kontinuum/backup/kit.py, written by `python -m kontinuum backup-kit`) it reads
them from the kit instead: no state, no passphrase, no admin credential; without --zone, every
zone of the kit, one after the other (exit 1 if any failed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=["verify"], help="verify: prove an existing backup restores")
    parser.add_argument("file", nargs="?", help="with verify: the backup file (a path or its s3:// URL)")
    parser.add_argument("--stack", "-s", help="the stack (region); not with --kit")
    parser.add_argument("--zone", "-z", help="the zone, as in kontinuum:zones (with --kit: default every zone)")
    parser.add_argument("--kit", type=Path, help="a backup kit (`backup-kit`): read it instead of the stack's state")
    parser.add_argument("--cwd", "-C", type=Path, default=None, help="the Pulumi project folder (default: here)")
    parser.add_argument("--destination", "--directory", dest="destination",
                        help="a folder or s3:// URL (default: the zone's backup.destination)")
    parser.add_argument("--keep", type=int, help="newest files kept (default: the zone's backup.keep)")
    parser.add_argument("--verify", action="store_true", help="after taking the backup, prove it restores")
    parser.add_argument("--verify-timeout", type=float, default=None, help="seconds a verification may take "
                        "(default 180)")


def run(args: argparse.Namespace) -> int:
    from kontinuum.backup.stack_state import zone_access
    from kontinuum.errors import KontinuumError
    from kontinuum.recover import export

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    if (args.action == "verify") != bool(args.file):
        log("backup: `backup verify <file or s3:// URL>` names the file; `backup [--verify]` takes none")
        return 2
    if bool(args.kit) == bool(args.stack) or (not args.kit and not args.zone):
        log("backup: name the zone with --stack S --zone Z (reads the state), or give --kit FILE (reads the kit)")
        return 2
    cwd = (args.cwd or Path.cwd()).resolve()
    try:
        if args.kit:
            return _from_kit(args, cwd, log)
        exported = export(args.stack, cwd, show_secrets=True)
        if exported is None:
            log(f"backup: stack {args.stack} does not exist")
            return 1
        access, settings = zone_access(exported.get("deployment") or {}, args.stack, args.zone)
    except KontinuumError as e:
        log(f"backup: {e}")
        return 1
    return _one(args.stack, access, settings, args, cwd, log)


def _from_kit(args: argparse.Namespace, cwd: Path, log) -> int:
    from kontinuum.backup import kit

    stack, zones = kit.load(args.kit)
    if args.zone and args.zone not in zones:
        log(f"backup: zone {args.zone!r} is not in kit {args.kit} (it holds {', '.join(sorted(zones))})")
        return 1
    codes = [_one(stack, *zones[z], args, cwd, log) for z in ([args.zone] if args.zone else sorted(zones))]
    return max(codes)


def _one(stack: str, access, settings, args: argparse.Namespace, cwd: Path, log) -> int:
    """Take (or, with `verify FILE`, verify) one zone's backup."""
    from kontinuum.backup import store as stores
    from kontinuum.backup.destination import resolve
    from kontinuum.backup.files import DEFAULT_DIRECTORY, DEFAULT_KEEP
    from kontinuum.backup.take import take
    from kontinuum.errors import KontinuumError

    try:
        if args.action == "verify":
            store, name = stores.for_file(args.file)
            return _verify(access, store, name, args, log)
        where = resolve(args.destination, cwd) if args.destination else (
            settings.destination if settings else str(cwd / DEFAULT_DIRECTORY))
        keep = args.keep or (settings.keep if settings else DEFAULT_KEEP)
        store = stores.for_zone(where, stack, access.cluster)
        taken = take(access, store, keep=keep, log=log)
    except KontinuumError as e:
        log(f"backup: {e}")
        return 1
    log(f"backup: {access.cluster}: {taken.size} bytes from {taken.node}, etcd sha256 {taken.sha256}")
    for p in taken.pruned:
        log(f"backup: removed {p} (keeping the newest {keep})")
    print(taken.path)
    if args.verify:
        try:
            return _verify(access, store, taken.name, args, log)
        except KontinuumError as e:
            log(f"backup: {e}")
            return 1
    return 0


def _verify(access, store, name: str, args, log) -> int:
    from kontinuum.backup import scratch_etcd
    from kontinuum.backup.verify import verify
    from kontinuum.errors import KontinuumError

    try:
        doc = verify(access, store, name, timeout=args.verify_timeout or scratch_etcd.DEFAULT_TIMEOUT, log=log)
    except KontinuumError as e:
        log(f"backup: {store.describe(name)} does NOT restore: {e}")
        return 1
    log(f"backup: verified {store.describe(name)}: restores to revision {doc['revision']} with {doc['keys']} keys; "
        f"{', '.join(doc['objects'])} read back ({doc['seconds']} s, etcd {doc['etcdVersion']})")
    return 0
