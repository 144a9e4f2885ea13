"""The zone's backup credential: a talosconfig whose client certificate carries the
`os:etcd:backup` role only (Talos lets it take etcd snapshots and read etcd's status, members
and alarms; everything else is refused), issued from the zone's Talos API CA by the zone's
EtcdBackup resource and held as a Pulumi secret. `backup` and `backup.onUp` use it, never the
admin talosconfig."""

from __future__ import annotations

import datetime as dt

from kontinuum.people import talosconfig_for
from kontinuum.talos import pki, renewal, secrets, talosconfig

ROLE = "os:etcd:backup"
LIFETIME = dt.timedelta(days=talosconfig.CLIENT_CERT_DAYS)
RENEW_BEFORE_DAYS = 30.0  # the default of certificates.renewBefore


def issue(cluster: str, secrets_yaml: str, control_planes: list[str], now: dt.datetime | None = None) -> str:
    text, _ = talosconfig_for(cluster, secrets_yaml, list(control_planes), role=ROLE, ttl=LIFETIME, now=now)
    return text


def stale(text: str | None, secrets_yaml: str, control_planes: list[str],
          renew_before_days: float = RENEW_BEFORE_DAYS) -> bool:
    """Reissue when missing, due for renewal, for other control planes, or from another CA than
    the zone's current Talos API CA (after a CA rotation)."""
    if not text:
        return True
    try:
        held = talosconfig.parse(text)
        bundle = secrets.load(secrets_yaml, check_rsa=False)
        issuer = pki.load_certificate(bundle.os.crt)
        cert = pki.load_certificate(held.crt)
        cert.verify_directly_issued_by(issuer)
    except Exception:  # noqa: BLE001 - unreadable or not issued by the current CA: issue a new one
        return True
    return held.endpoints != list(control_planes) or renewal.due(held.crt, renew_before_days)
