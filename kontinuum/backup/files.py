"""Where backup files go, what they are called and how many are kept.

    <directory>/<stack>/<region>-<zone>/<region>-<zone>-<UTC YYYYmmddTHHMMSSZ>.etcd.sealed

The UTC time in the name sorts as text, so "newest N" is a sort by name. A file being written
is `<name>.part` and is renamed into place only after the whole snapshot passed its checks; a
`.part` left by a killed run is removed by the next backup of that zone.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

SUFFIX = ".etcd.sealed"
DEFAULT_DIRECTORY = ".state/backups"  # relative to the Pulumi project folder; git ignores .state/
DEFAULT_KEEP = 7


def zone_directory(directory: Path, stack: str, cluster: str) -> Path:
    return Path(directory) / stack.rsplit("/", 1)[-1] / cluster


def file_name(cluster: str, when: dt.datetime) -> str:
    return f"{cluster}-{when.astimezone(dt.timezone.utc):%Y%m%dT%H%M%SZ}{SUFFIX}"


def _pattern(cluster: str) -> re.Pattern:
    return re.compile(rf"^{re.escape(cluster)}-\d{{8}}T\d{{6}}Z{re.escape(SUFFIX)}$")


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
