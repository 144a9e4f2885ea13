"""A zone's ZoneAccess read from the stack's state, the way `recover` reads it: the engine's
`stack export --show-secrets` (secrets are held in memory only, never printed or written).

From the state: the region (stack output), the zone's TalosSecrets (control-plane endpoints;
talosconfig and secrets bundle as its CaRotation hands them on), its EtcdBackup (key, backup
credential, destination, keep) and the worker addresses of its ConfigApply resources.
"""

from __future__ import annotations

from dataclasses import dataclass

from kontinuum.backup.zone import BackupError, ZoneAccess
from kontinuum.recover import secret_value
from kontinuum.talos.talosconfig import APID_PORT

STACK_TYPE = "pulumi:pulumi:Stack"


@dataclass(frozen=True)
class BackupSettings:
    destination: str  # a folder or an s3:// URL
    keep: int


def resource_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def resource_props(res: dict) -> dict:
    return {k: secret_value(v) for k, v in {**(res.get("inputs") or {}), **(res.get("outputs") or {})}.items()}


def zone_access(deployment: dict, stack: str, zone: str) -> tuple[ZoneAccess, BackupSettings | None]:
    resources = deployment.get("resources") or []
    root = next((r for r in resources if r.get("type") == STACK_TYPE), None)
    region = secret_value(((root or {}).get("outputs") or {}).get("region"))
    if not region:
        raise BackupError(f"stack {stack} has no `region` output: has `pulumi up` run on it?")
    cluster = f"{region}-{zone}"
    by_name = {resource_name(r["urn"]): r for r in resources if r.get("custom")}
    known = sorted(resource_name(r["urn"])[len(region) + 1:] for r in resources
                   if r.get("type") == "kontinuum:index:Zone" and resource_name(r["urn"]).startswith(f"{region}-"))
    secrets_res = by_name.get(f"{cluster}-secrets")
    if secrets_res is None:
        raise BackupError(f"stack {stack} has no zone {zone!r} (zones in its state: {', '.join(known) or 'none'})")
    s = resource_props(secrets_res)
    # What the nodes trust: the CaRotation hands TalosSecrets' bundle on only once a rotation finished.
    s.update({k: v for k, v in resource_props(by_name.get(f"{cluster}-ca-rotation") or {}).items()
              if k in ("talosconfig", "secretsYaml") and v})
    backup = resource_props(by_name.get(f"{cluster}-etcd-backup") or {})
    workers, port = [], backup.get("talosPort")
    for r in resources:
        parent = r.get("parent") or ""
        p = resource_props(r) if parent.endswith(f"kontinuum:index:TalosCluster::{cluster}") else {}
        if p.get("role") == "worker" and p.get("address"):
            workers.append(str(p["address"]))
        if p.get("role") == "controlplane" and p.get("talosPort"):
            port = port or p["talosPort"]
    access = ZoneAccess(cluster=cluster, talosconfig=str(s.get("talosconfig") or ""),
                        secrets_yaml=str(s.get("secretsYaml") or ""),
                        control_planes=tuple(str(a) for a in s.get("endpoints") or []),
                        workers=tuple(sorted(workers)), talos_port=int(port or APID_PORT), key=backup.get("key"),
                        backup_talosconfig=str(backup.get("backupTalosconfig") or ""))
    if not access.talosconfig or not access.secrets_yaml or not access.control_planes:
        raise BackupError(f"zone {cluster}: the state holds no talosconfig, secrets or control planes for it yet "
                          "(run `pulumi up` first)")
    where = backup.get("destination") or backup.get("directory")  # `directory`: state of older versions
    settings = BackupSettings(str(where), int(backup["keep"])) if where else None
    return access, settings


def zone_kubeconfig(deployment: dict, cluster: str) -> str:
    """The zone's admin kubeconfig as its Kubeconfig resource holds it (server and CA for a
    person's kubeconfig; its own certificate is never handed out)."""
    for r in deployment.get("resources") or []:
        if r.get("custom") and resource_name(r["urn"]) == f"{cluster}-kubeconfig" and r["type"].endswith(":Kubeconfig"):
            if text := resource_props(r).get("kubeconfig"):
                return str(text)
    raise BackupError(f"zone {cluster}: the state holds no kubeconfig for it yet (run `pulumi up` first)")
