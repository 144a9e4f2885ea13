"""`python -m kontinuum kubeconfig --stack S --zone Z [--group G] [--user U] [--ttl 8h] [-o FILE]`:
a kubeconfig for a person, issued locally from the zone's Kubernetes CA as user U in one group
bound by every zone to a built-in ClusterRole (default kontinuum:view → view), short-lived
(default 8h); written 0600; says when it expires. Never system:masters."""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path

from kontinuum.cli.people_common import add_zone_arguments, write_private


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kontinuum.people import KUBE_GROUPS

    add_zone_arguments(parser, "8h")
    parser.add_argument("--group", default="kontinuum:view", choices=tuple(KUBE_GROUPS),
                        help="kontinuum:view (default; ClusterRole view), kontinuum:edit (edit), "
                             "kontinuum:admin (cluster-admin)")
    parser.add_argument("--user", default=None, help="the user name in the certificate (default: your login)")


def run(args: argparse.Namespace) -> int:
    from kontinuum.backup.stack_state import zone_kubeconfig
    from kontinuum.cli.people_common import zone_state
    from kontinuum.errors import KontinuumError
    from kontinuum.people import expires_text, kubeconfig_for, parse_ttl

    try:
        ttl = parse_ttl(args.ttl)
        access, deployment = zone_state(args)
        admin = zone_kubeconfig(deployment, access.cluster)
        user = args.user or getpass.getuser()
        text, expires = kubeconfig_for(admin, access.secrets_yaml, user=user, group=args.group, ttl=ttl)
    except KontinuumError as e:
        print(f"kubeconfig: {e}", file=sys.stderr)
        return 1
    path = args.output or Path(f"{access.cluster}-kubeconfig")
    write_private(path, text)
    print(f"kubeconfig: {path} ({user} in {args.group} on {access.cluster}), expires {expires_text(expires)}. "
          f"Use: kubectl --kubeconfig {path} …", file=sys.stderr)
    return 0
