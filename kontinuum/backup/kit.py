"""A backup kit: what a backup job needs of a stack's zones and nothing else (issue 30).

Reading the stack's state means decrypting it, admin credentials included; a nightly job that
only takes and verifies backups should not hold those. An operator writes the kit once from the
state (`python -m kontinuum backup-kit`); the job then runs `backup --kit FILE` with no state
and no passphrase. Per zone the kit holds the control planes, the Talos port, the destination
and how many files to keep, the zone's identity hashes (public: what a backup file is checked
against), and two secrets: the os:etcd:backup talosconfig and the backup key that seals the
files. It is written 0600 and must be kept as a secret (a CI secret file). Renew it when the
backup credential is renewed (`pulumi up` within certificates.renewBefore; `status` says when).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from kontinuum.backup.errors import BackupError
from kontinuum.backup.stack_state import BackupSettings
from kontinuum.backup.zone import Identity, ZoneAccess

KIND, VERSION = "kontinuum-backup-kit", 1


def zone_entry(access: ZoneAccess, settings: BackupSettings | None, destination: str, keep: int) -> dict:
    if not access.backup_talosconfig:
        raise BackupError(f"zone {access.cluster}: the stack holds no backup credential for it yet; run `pulumi up` once")
    who = access.identity()
    return {"cluster": access.cluster, "controlPlanes": list(access.control_planes), "talosPort": access.talos_port,
            "destination": settings.destination if settings else destination, "keep": settings.keep if settings else keep,
            "identity": {"clusterIdSha256": who.cluster_id_sha256, "etcdCaSha256": who.etcd_ca_sha256},
            "key": access.require_key(), "talosconfig": access.backup_talosconfig}


def render(stack: str, zones: dict[str, dict]) -> str:
    return yaml.safe_dump({"kind": KIND, "version": VERSION, "stack": stack, "zones": zones}, sort_keys=False)


def write(path: Path, text: str) -> None:
    """0600 from the first byte: the kit holds a credential and the key of every backup file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def load(path: Path) -> tuple[str, dict[str, tuple[ZoneAccess, BackupSettings]]]:
    """(stack, {zone: (access, settings)}) of a kit file; a clear error naming the file otherwise."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise BackupError(f"backup kit {path}: cannot be read ({e.__class__.__name__})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("version") != VERSION:
        raise BackupError(f"backup kit {path}: not a {KIND} version {VERSION} (write one with "
                          "`python -m kontinuum backup-kit --stack S --out FILE`)")
    zones = {}
    for name, z in (doc.get("zones") or {}).items():
        try:
            ident = Identity(z["identity"]["clusterIdSha256"], z["identity"]["etcdCaSha256"])
            access = ZoneAccess(cluster=z["cluster"], talosconfig="", secrets_yaml="",
                                control_planes=tuple(z["controlPlanes"]), talos_port=int(z["talosPort"]),
                                key=z["key"], backup_talosconfig=z["talosconfig"], known_identity=ident)
            zones[name] = (access, BackupSettings(str(z["destination"]), int(z["keep"])))
        except (KeyError, TypeError, ValueError) as e:
            raise BackupError(f"backup kit {path}: zone {name!r} lacks {e}; write the kit again") from None
    if not zones:
        raise BackupError(f"backup kit {path}: holds no zone")
    return str(doc.get("stack") or ""), zones
