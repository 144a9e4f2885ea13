"""What `talosconfig` and `kubeconfig` share: the zone's secrets read from the stack's state
(`stack export --show-secrets`, held in memory only) and a credential written 0600."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_zone_arguments(parser: argparse.ArgumentParser, default_ttl: str) -> None:
    parser.add_argument("--stack", "-s", required=True, help="the stack (region)")
    parser.add_argument("--zone", "-z", required=True, help="the zone, as in kontinuum:zones")
    parser.add_argument("--ttl", default=default_ttl, help=f"lifetime, e.g. 30m, 8h, 7d (default {default_ttl}, at most 365d)")
    parser.add_argument("--output", "-o", type=Path, help="file to write (0600; default: ./<zone>-<kind>)")
    parser.add_argument("--cwd", "-C", type=Path, default=None, help="the Pulumi project folder (default: here)")


def zone_state(args: argparse.Namespace):
    """(ZoneAccess, the stack's deployment) of args.zone; raises KontinuumError when missing."""
    from kontinuum.backup.stack_state import zone_access
    from kontinuum.errors import KontinuumError
    from kontinuum.recover import export

    exported = export(args.stack, (args.cwd or Path.cwd()).resolve(), show_secrets=True)
    if exported is None:
        raise KontinuumError(f"stack {args.stack} does not exist")
    deployment = exported.get("deployment") or {}
    return zone_access(deployment, args.stack, args.zone)[0], deployment


def write_private(path: Path, text: str) -> None:
    """Created 0600 from the start: the key is never readable by others, not even briefly."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
