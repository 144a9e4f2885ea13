"""`python -m kontinuum talosconfig --stack S --zone Z [--role R] [--ttl 8h] [-o FILE]`: a
talosconfig for a person, issued locally from the zone's Talos CA with one role (default
os:reader) and a short life (default 8h); written 0600; says when it expires. No node is asked."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kontinuum.cli.people_common import add_zone_arguments, write_private


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kontinuum.people import TALOS_ROLES

    add_zone_arguments(parser, "8h")
    parser.add_argument("--role", default="os:reader", choices=TALOS_ROLES,
                        help="os:reader (default: logs, services, resources), os:operator (also reboot, restart, "
                             "etcd snapshot), os:admin (everything), os:etcd:backup (etcd snapshots only)")


def run(args: argparse.Namespace) -> int:
    from kontinuum.cli.people_common import zone_state
    from kontinuum.errors import KontinuumError
    from kontinuum.people import expires_text, parse_ttl, talosconfig_for

    try:
        ttl = parse_ttl(args.ttl)
        access, _ = zone_state(args)
        text, expires = talosconfig_for(access.cluster, access.secrets_yaml, list(access.control_planes),
                                        role=args.role, ttl=ttl)
    except KontinuumError as e:
        print(f"talosconfig: {e}", file=sys.stderr)
        return 1
    path = args.output or Path(f"{access.cluster}-talosconfig")
    write_private(path, text)
    nodes = ", ".join((*access.control_planes, *access.workers))
    print(f"talosconfig: {path} ({args.role} on {access.cluster}), expires {expires_text(expires)}. Nodes: {nodes}. "
          f"Use: talosctl --talosconfig {path} -n <node> …", file=sys.stderr)
    return 0
