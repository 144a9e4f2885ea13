"""`python -m kontinuum backup-kit --stack S --out FILE [--zone Z]…`: write what a backup job needs
of the stack's zones (kontinuum/backup/kit.py) to FILE, 0600, so the job runs `backup --kit FILE`
without the stack's state, its passphrase or any admin credential. Reads the state once (run it
as an operator); says what the kit holds and when its credential expires, never a secret."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stack", "-s", required=True, help="the stack (region)")
    parser.add_argument("--zone", "-z", action="append", help="only this zone (repeatable; default every zone)")
    parser.add_argument("--out", "-o", type=Path, required=True, help="the kit file to write (0600)")
    parser.add_argument("--cwd", "-C", type=Path, default=None, help="the Pulumi project folder (default: here)")


def run(args: argparse.Namespace) -> int:
    from kontinuum.backup import kit
    from kontinuum.backup.files import DEFAULT_DIRECTORY, DEFAULT_KEEP
    from kontinuum.backup.stack_state import zone_access
    from kontinuum.errors import KontinuumError
    from kontinuum.recover import export
    from kontinuum.status_probe import zones_of
    from kontinuum.talos import renewal, talosconfig

    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    cwd = (args.cwd or Path.cwd()).resolve()
    try:
        exported = export(args.stack, cwd, show_secrets=True)
        if exported is None:
            log(f"backup-kit: stack {args.stack} does not exist")
            return 1
        deployment = exported.get("deployment") or {}
        zones = {}
        for zone in args.zone or zones_of(deployment)[1]:
            access, settings = zone_access(deployment, args.stack, zone)
            zones[zone] = kit.zone_entry(access, settings, str(cwd / DEFAULT_DIRECTORY), DEFAULT_KEEP)
        if not zones:
            log(f"backup-kit: stack {args.stack} has no zone in its state yet; run `pulumi up` first")
            return 1
        kit.write(args.out, kit.render(args.stack, zones))
    except KontinuumError as e:
        log(f"backup-kit: {e}")
        return 1
    for zone, entry in zones.items():
        expires = renewal.expiry(talosconfig.parse(entry["talosconfig"]).crt)
        log(f"backup-kit: {entry['cluster']}: os:etcd:backup credential (expires {expires:%Y-%m-%d}), backup key, "
            f"destination {entry['destination']}")
    log(f"backup-kit: wrote {args.out} (0600). Keep it as a secret; write it again after `pulumi up` renews the "
        "backup credential")
    return 0
