"""Where backup files go, what they are called and how many are kept.

    <destination>/<stack>/<region>-<zone>/<region>-<zone>-<UTC YYYYmmddTHHMMSSZ>.etcd.sealed
    … beside it, once verified: <that name>.verified.json

The destination is a folder or an S3 bucket (store.py). The UTC time in the name sorts as text,
so "newest N" is a sort by name and the name says when it was taken, wherever it is stored. A
file being written is `<name>.part` (a folder) or a local staging copy (a bucket) and is put in
place only after the whole snapshot passed its checks; a `.part` left by a killed run is removed
by the next backup of that zone.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

SUFFIX = ".etcd.sealed"
VERIFIED_SUFFIX = ".verified.json"  # the record `backup --verify` leaves beside a file
DEFAULT_DIRECTORY = ".state/backups"  # relative to the Pulumi project folder; git ignores .state/
DEFAULT_KEEP = 7


def zone_directory(directory: Path, stack: str, cluster: str) -> Path:
    return Path(directory) / stack.rsplit("/", 1)[-1] / cluster


def file_name(cluster: str, when: dt.datetime) -> str:
    return f"{cluster}-{when.astimezone(dt.timezone.utc):%Y%m%dT%H%M%SZ}{SUFFIX}"


def _pattern(cluster: str) -> re.Pattern:
    return re.compile(rf"^{re.escape(cluster)}-\d{{8}}T\d{{6}}Z{re.escape(SUFFIX)}$")


def finished(names: list[str], cluster: str) -> list[str]:
    """The zone's finished backup files among `names`, oldest first."""
    pattern = _pattern(cluster)
    return sorted(n for n in names if pattern.match(n))


def taken_at(name: str) -> dt.datetime:
    """When the snapshot in a backup file of ours was taken (its name says so)."""
    stamp = name[: -len(SUFFIX)].rsplit("-", 1)[-1]
    return dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.timezone.utc)


def verified_name(name: str) -> str:
    return name + VERIFIED_SUFFIX


def prune_store(store, cluster: str, keep: int) -> list[str]:
    """Delete all but the newest `keep` backups (and their verification records) in a store."""
    names = store.names()
    found = finished(names, cluster)
    gone = []
    for name in found[: max(0, len(found) - keep)]:
        store.delete(name)
        gone.append(store.describe(name))
        if verified_name(name) in names:
            store.delete(verified_name(name))
    return gone


def backups(folder: Path, cluster: str) -> list[Path]:
    """The zone's finished backup files, oldest first."""
    if not folder.is_dir():
        return []
    pattern = _pattern(cluster)
    return sorted(p for p in folder.iterdir() if pattern.match(p.name))


def prune(folder: Path, cluster: str, keep: int) -> list[Path]:
    """Delete all but the newest `keep` backups and any leftover `.part`; returns what went."""
    gone = []
    for p in backups(folder, cluster)[: max(0, len(backups(folder, cluster)) - keep)]:
        p.unlink(missing_ok=True)
        gone.append(p)
    if folder.is_dir():
        for p in folder.glob(f"{cluster}-*{SUFFIX}.part"):
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone
