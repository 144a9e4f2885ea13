"""Take one etcd backup of a zone: EtcdSnapshot from the first control plane that answers, with
the zone's os:etcd:backup client certificate only, checked (talosctl's size % 512 == 32, etcd's
sha256 trailer, the bbolt magic) and sealed as it streams into a staged file, put in place (a
folder: renamed; a bucket: uploaded) only when whole, then the newest `keep` kept."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kontinuum.backup import files, sealed, store as stores
from kontinuum.backup.snapshot import SnapshotCheck, SnapshotInvalid
from kontinuum.backup.zone import BackupError, ZoneAccess
from kontinuum.talos import etcd_stream
from kontinuum.talos.errors import TalosError


@dataclass(frozen=True)
class Taken:
    path: str  # the file's path, or its s3:// URL
    name: str
    node: str
    size: int  # bytes of the snapshot (database + trailer)
    sha256: str  # etcd's hash of the database
    pruned: tuple[str, ...]


def take(access: ZoneAccess, store, *, keep: int = files.DEFAULT_KEEP, now: dt.datetime | None = None,
         timeout: float = etcd_stream.SNAPSHOT_TIMEOUT, log: Callable[[str], None] = lambda m: None) -> Taken:
    """store: the zone's backup store (store.py), or a folder."""
    store = stores.FolderStore(store) if isinstance(store, Path) else store
    key = access.require_key()
    who = access.identity()
    when = now or dt.datetime.now(dt.timezone.utc)
    name = files.file_name(access.cluster, when)
    problems = []
    for node in access.control_planes:
        header = sealed.Header(zone=access.cluster, created=when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                               key_id=sealed.key_id(key), cluster_id_sha256=who.cluster_id_sha256,
                               etcd_ca_sha256=who.etcd_ca_sha256, node=node)
        check = SnapshotCheck()
        part = store.stage(name)
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                sealer = sealed.Sealer(out, key, header)

                def sink(chunk: bytes) -> None:
                    check.update(chunk)
                    sealer.write(chunk)

                etcd_stream.snapshot(access.backup_client(node), sink, timeout=timeout)
                size, digest = check.finish()
                sealer.close()
                out.flush()
                os.fsync(out.fileno())
        except TalosError as exc:
            store.discard(part)
            problems.append(str(exc))
            log(f"backup {access.cluster}: {node} gave no snapshot ({exc.problem}); trying the next control plane")
            continue
        except SnapshotInvalid as exc:
            store.discard(part)
            problems.append(f"etcd snapshot from {node}: {exc}")
            continue
        except BaseException:
            store.discard(part)
            raise
        where = store.commit(part, name)
        pruned = files.prune_store(store, access.cluster, keep)
        if isinstance(store, stores.FolderStore):
            pruned += files.prune(store.folder, access.cluster, keep)  # a killed run's `.part`
        return Taken(where, name, node, size, digest, tuple(str(p) for p in pruned))
    raise BackupError(f"zone {access.cluster}: no control plane gave an intact etcd snapshot:\n  "
                      + "\n  ".join(problems) + "\nCheck that the zone's etcd is healthy "
                      "(`python -m kontinuum restore` brings back a lost one) and retry.")
