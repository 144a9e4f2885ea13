"""Client-certificate renewal of the credentials a stack holds (day-2 facts §4): the admin
talosconfig (os:admin, 1 year, talosctl's TTL) and the admin kubeconfig (CN admin,
O system:masters, 1 year as Talos's Kubeconfig RPC mints it). Both CAs are in our secrets
bundle, so renewal is local: no node is asked, nothing on a node changes.

A credential is due when it expires within `renew_before` days (default 30); the resources
that hold them renew on the next `pulumi up`, ahead of every resource that uses them.
"""

from __future__ import annotations

import base64
import datetime as dt

import yaml

from kontinuum.talos import pki, talosconfig
from kontinuum.talos.pki import CertKey

RENEW_BEFORE_DAYS = 30
KUBECONFIG_CERT_DAYS = 365  # Talos: cluster.adminKubeconfig.certLifetime default


def expiry(cert_pem: bytes) -> dt.datetime:
    return pki.load_certificate(cert_pem).not_valid_after_utc


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def due(cert_pem: bytes, renew_before_days: float, now: dt.datetime | None = None) -> bool:
    return expiry(cert_pem) - dt.timedelta(days=renew_before_days) <= (now or pki.utcnow())


# --- talosconfig ---------------------------------------------------------------------------------


def talosconfig_cert(text: str) -> bytes:
    return talosconfig.parse(text).crt


def renew_talosconfig_cert(os_ca: CertKey, now: dt.datetime | None = None) -> CertKey:
    return talosconfig.issue_client_cert(os_ca, now=now)


# --- kubeconfig ----------------------------------------------------------------------------------


def _user(doc: dict) -> dict:
    current = next((c for c in doc.get("contexts") or [] if c.get("name") == doc.get("current-context")), None)
    name = ((current or {}).get("context") or {}).get("user")
    user = next((u for u in doc.get("users") or [] if u.get("name") == name), None)
    if user is None:
        raise ValueError("the kubeconfig's current context has no user")
    return user.setdefault("user", {})


def kubeconfig_cert(text: str) -> bytes:
    return base64.b64decode(_user(yaml.safe_load(text))["client-certificate-data"])


def kubeconfig_ca(text: str) -> bytes:
    """The CA certificate(s) the kubeconfig's current cluster trusts."""
    doc = yaml.safe_load(text)
    current = next((c for c in doc.get("contexts") or [] if c.get("name") == doc.get("current-context")), None)
    name = ((current or {}).get("context") or {}).get("cluster")
    cluster = next((c for c in doc.get("clusters") or [] if c.get("name") == name), None) or {}
    return base64.b64decode((cluster.get("cluster") or {}).get("certificate-authority-data") or "")


def renew_kubeconfig(text: str, k8s_ca: CertKey, now: dt.datetime | None = None, *, common_name: str = "admin",
                     groups: tuple[str, ...] = ("system:masters",), lifetime: dt.timedelta | None = None) -> str:
    """The same kubeconfig (server, names) with a fresh client certificate of `k8s_ca` (admin by
    default; another user, groups and lifetime for a person's), which it trusts as the server's
    CA too (after a CA rotation it is a new one)."""
    doc = yaml.safe_load(text)
    for cluster in doc.get("clusters") or []:
        if (cluster.get("cluster") or {}).get("certificate-authority-data"):
            cluster["cluster"]["certificate-authority-data"] = base64.b64encode(k8s_ca.crt).decode()
    client = pki.issue_cert(k8s_ca, common_name=common_name, organizations=list(groups), client=True,
                            key_type="ecdsa", days=KUBECONFIG_CERT_DAYS, now=now, lifetime=lifetime)
    user = _user(doc)
    user["client-certificate-data"] = base64.b64encode(client.crt).decode()
    user["client-key-data"] = base64.b64encode(pki.to_standard_pem(client.key)).decode()
    return yaml.safe_dump(doc, sort_keys=False)
