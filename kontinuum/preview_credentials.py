"""What a zone's credential changes in a preview plan mean (pure, no I/O), for the summary
(kontinuum/preview_summary.py): which CA rotations start, which client certificates are renewed,
and, where the plan cannot know a value yet, which input makes it unknown.

A record-only update (a token recorded, a rotation block deleted after its rotation, a renewal
window moved with nothing due) keeps every certificate: the providers name those outputs stable
(providers/previews.py), so nothing downstream changes and nothing here claims a renewal.
Read from the TalosSecrets step (old outputs, new inputs) and each Kubeconfig step; secrets are
"[secret]" in the plan and never needed: expiries and tokens are plain.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from kontinuum.talos import ca_rotation

DEFAULT_RENEW_BEFORE = 30.0  # days (kontinuum/talos/renewal.py RENEW_BEFORE_DAYS)


def _expires(value) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return None


def _days(value) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else DEFAULT_RENEW_BEFORE


def renewal_due(expires, renew_before, now: dt.datetime) -> bool:
    when = _expires(expires)
    return when is not None and when - dt.timedelta(days=_days(renew_before)) <= now


@dataclass
class Credentials:
    """One zone's credential changes in a plan."""

    rotations: dict[str, tuple[str | None, str]] = field(default_factory=dict)  # kind -> (old token, new)
    talosconfig_due: str | None = None  # its expiry, when the update renews it
    renew_before: float = DEFAULT_RENEW_BEFORE
    kubeconfig_why: str | None = None

    @classmethod
    def of(cls, old: dict, new: dict, now: dt.datetime) -> "Credentials":
        """From the TalosSecrets step: a token changed on a zone that records tokens starts a
        rotation (providers/talos_secrets.py `_started`)."""
        c = cls(renew_before=_days(new.get("renewBeforeDays")))
        if isinstance(old.get("rotate"), dict) and isinstance(new.get("rotate"), dict):
            c.rotations = {k: (old["rotate"].get(k), new["rotate"][k]) for k in ca_rotation.KINDS
                           if new["rotate"].get(k) and new["rotate"].get(k) != old["rotate"].get(k)}
        if renewal_due(old.get("talosconfigExpires"), new.get("renewBeforeDays"), now):
            c.talosconfig_due = str(old["talosconfigExpires"])
        return c

    def lines(self) -> list[str]:
        out = [f"CA rotation of the {ca_rotation.TITLE[k]} (certificates.rotate.{k}: {old or '∅'} → {new}): "
               "every node, one at a time, no reboot; accept, swap, clients switched, old CA dropped"
               for k, (old, new) in self.rotations.items()]
        if self.talosconfig_due and "talos" not in self.rotations:
            out.append(f"admin talosconfig renewed: its certificate expires {self.talosconfig_due}, within "
                       f"certificates.renewBefore ({self.renew_before:g} days)")
        return out

    def kubeconfig(self, old: dict, new: dict, now: dt.datetime) -> str | None:
        """Why a Kubeconfig update changes the admin kubeconfig, or None when it keeps it."""
        why = cause = None
        if "kubernetes" in self.rotations:
            why = cause = "re-issued from the new Kubernetes CA (certificates.rotate.kubernetes)"
        elif old.get("valid") is False or renewal_due(old.get("kubeconfigExpires"), new.get("renewBeforeDays"), now):
            why = (f"admin kubeconfig renewed: its certificate expires {old.get('kubeconfigExpires')}, within "
                   f"certificates.renewBefore ({_days(new.get('renewBeforeDays')):g} days)")
            cause = "renewed (certificates.renewBefore)"
        elif old.get("address") != new.get("address"):
            why = cause = f"fetched again from {new.get('address')}"
        self.kubeconfig_why = cause  # what makes the zone's Kubernetes provider's config unknown at preview
        return why

    def rotation_cause(self) -> str | None:
        """What makes the zone's machine configs unknown at preview, when a CA rotation does."""
        if not self.rotations:
            return None
        kinds = ", ".join(f"certificates.rotate.{k}" for k in self.rotations)
        return f"the secrets bundle they are rendered from changes with the CA rotation ({kinds})"

    def unknown_config(self) -> str:
        """Why a machine config view is not known at preview."""
        if self.rotations:
            kinds = ", ".join(f"certificates.rotate.{k}" for k in self.rotations)
            return f"the machine config is rendered from the secrets bundle, which the CA rotation changes ({kinds})"
        return "the machine config view (input configView) is computed from an input not known at preview"

    def unknown_release(self) -> str:
        """Why a Helm release with unchanged values is planned."""
        if self.kubeconfig_why:
            return f"the zone's admin kubeconfig (the Kubernetes provider's config) is {self.kubeconfig_why}"
        return "an input of the release (or its Kubernetes provider's config) is not known at preview"
