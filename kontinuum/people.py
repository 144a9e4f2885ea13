"""Credentials for people: a talosconfig or a kubeconfig for one zone, issued locally from the
zone's CAs (in the stack's secrets bundle) with the least role the job needs and a short life.

Talos roles (reference/failure-facts.md §6) travel in the client certificate's Organization:
os:reader reads (logs, services, resources; no secrets), os:operator also reboots, restarts
services and takes etcd snapshots, os:admin may do everything, os:etcd:backup only takes and
inspects etcd snapshots. Kubernetes groups are bound by every zone (kontinuum_components/
access.py) to the built-in ClusterRoles: kontinuum:view → view, kontinuum:edit → edit,
kontinuum:admin → cluster-admin; none of them is system:masters, so deleting a binding takes the
power back, which no RBAC change can do for system:masters.
"""

from __future__ import annotations

import datetime as dt
import re

from kontinuum.errors import KontinuumError
from kontinuum.talos import pki, renewal, secrets, talosconfig

TALOS_ROLES = ("os:reader", "os:operator", "os:admin", "os:etcd:backup")
KUBE_GROUPS = {"kontinuum:view": "view", "kontinuum:edit": "edit", "kontinuum:admin": "cluster-admin"}
DEFAULT_TTL = "8h"
MAX_TTL = dt.timedelta(days=365)  # Talos's own default for a client certificate
_TTL = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


class CredentialError(KontinuumError):
    pass


def parse_ttl(text: str) -> dt.timedelta:
    """"90m", "8h", "7d": a lifetime above zero and at most a year."""
    match = _TTL.match(text.strip())
    if not match:
        raise CredentialError(f"--ttl {text!r}: give a number and a unit, e.g. 30m, 8h or 7d")
    ttl = dt.timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    if not dt.timedelta(0) < ttl <= MAX_TTL:
        raise CredentialError(f"--ttl {text}: must be above zero and at most 365d")
    return ttl


def talosconfig_for(cluster: str, secrets_yaml: str, control_planes: list[str], *, role: str, ttl: dt.timedelta,
                    now: dt.datetime | None = None) -> tuple[str, dt.datetime]:
    """A talosconfig for `cluster` (endpoints: its control planes) with `role`; and its expiry."""
    if role not in TALOS_ROLES:
        raise CredentialError(f"--role {role}: one of {', '.join(TALOS_ROLES)}")
    bundle = secrets.load(secrets_yaml, check_rsa=False)
    client = talosconfig.issue_client_cert(bundle.os, role, now=now, lifetime=ttl)
    text = talosconfig.render(f"{role.removeprefix('os:')}@{cluster}", control_planes, control_planes[:1],
                              bundle.os.crt, client)
    return text, renewal.expiry(client.crt)


def kubeconfig_for(admin_kubeconfig: str, secrets_yaml: str, *, user: str, group: str, ttl: dt.timedelta,
                   now: dt.datetime | None = None) -> tuple[str, dt.datetime]:
    """The zone's kubeconfig (server, CA) for `user` in `group`; and its expiry."""
    if group not in KUBE_GROUPS:
        raise CredentialError(f"--group {group}: one of {', '.join(KUBE_GROUPS)} (bound to the ClusterRoles "
                              f"{', '.join(KUBE_GROUPS.values())} in every zone)")
    if not user or user.startswith("system:"):
        raise CredentialError(f"--user {user!r}: a person's name, not empty and not a system: identity")
    bundle = secrets.load(secrets_yaml, check_rsa=False)
    text = renewal.renew_kubeconfig(admin_kubeconfig, bundle.k8s, now, common_name=user, groups=(group,),
                                    lifetime=ttl)
    return text, renewal.expiry(renewal.kubeconfig_cert(text))


def expires_text(when: dt.datetime, now: dt.datetime | None = None) -> str:
    left = when - (now or pki.utcnow())
    return f"{renewal.rfc3339(when)} (in {str(left).split('.')[0]})"
