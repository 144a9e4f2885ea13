"""Take one etcd backup of a zone: EtcdSnapshot from the first control plane that answers,
checked (talosctl's size % 512 == 32, etcd's sha256 trailer, the bbolt magic) and sealed as it
streams into `<name>.part`, renamed into place only when whole, then the newest `keep` kept."""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kontinuum.backup import files, sealed
from kontinuum.backup.snapshot import SnapshotCheck, SnapshotInvalid
from kontinuum.backup.zone import BackupError, ZoneAccess
from kontinuum.talos import etcd_stream
from kontinuum.talos.errors import TalosError


@dataclass(frozen=True)
class Taken:
    path: Path
    node: str
    size: int  # bytes of the snapshot (database + trailer)
    sha256: str  # etcd's hash of the database
    pruned: tuple[Path, ...]


def take(access: ZoneAccess, folder: Path, *, keep: int = files.DEFAULT_KEEP, now: dt.datetime | None = None,
         timeout: float = etcd_stream.SNAPSHOT_TIMEOUT, log: Callable[[str], None] = lambda m: None) -> Taken:
    key = access.require_key()
    who = access.identity()
    when = now or dt.datetime.now(dt.timezone.utc)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    final = folder / files.file_name(access.cluster, when)
    part = final.with_name(final.name + ".part")
    problems = []
    for node in access.control_planes:
        header = sealed.Header(zone=access.cluster, created=when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                               key_id=sealed.key_id(key), cluster_id_sha256=who.cluster_id_sha256,
                               etcd_ca_sha256=who.etcd_ca_sha256, node=node)
        check = SnapshotCheck()
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                sealer = sealed.Sealer(out, key, header)

                def sink(chunk: bytes) -> None:
                    check.update(chunk)
                    sealer.write(chunk)

                etcd_stream.snapshot(access.client(node), sink, timeout=timeout)
                size, digest = check.finish()
                sealer.close()
                out.flush()
                os.fsync(out.fileno())
        except TalosError as exc:
            part.unlink(missing_ok=True)
            problems.append(str(exc))
            log(f"backup {access.cluster}: {node} gave no snapshot ({exc.problem}); trying the next control plane")
            continue
        except SnapshotInvalid as exc:
            part.unlink(missing_ok=True)
            problems.append(f"etcd snapshot from {node}: {exc}")
            continue
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        os.replace(part, final)
        pruned = files.prune(folder, access.cluster, keep)
        return Taken(final, node, size, digest, tuple(pruned))
    raise BackupError(f"zone {access.cluster}: no control plane gave an intact etcd snapshot:\n  "
                      + "\n  ".join(problems) + "\nCheck that the zone's etcd is healthy "
                      "(`python -m kontinuum restore` brings back a lost one) and retry.")
