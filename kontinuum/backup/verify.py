"""Verify a backup file: everything restore checks without touching the zone (ours, this zone's
and cluster's, sealed with its key, whole, an intact etcd snapshot), then a real restore into a
scratch etcd (scratch_etcd.py). The result is recorded beside the file as
`<name>.verified.json` (in the folder or the bucket), failed or not, so `status` can say which
backup is known to restore and since when."""

from __future__ import annotations

import datetime as dt
from typing import Callable

from kontinuum.backup import files, restore, scratch_etcd, sealed
from kontinuum.backup.snapshot import SnapshotCheck
from kontinuum.backup.zone import BackupError, ZoneAccess

RECORD_VERSION = 1


def record(name: str, *, ok: bool, at: dt.datetime, proof: scratch_etcd.Proof | None = None,
           checked: restore.Verified | None = None, problem: str | None = None) -> dict:
    """The sidecar's content: what was checked and what it found (nothing secret)."""
    doc = {"version": RECORD_VERSION, "file": name, "ok": ok, "verifiedAt": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if checked is not None:
        doc.update({"zone": checked.header.zone, "takenAt": checked.header.created, "node": checked.header.node,
                    "size": checked.size, "sha256": checked.sha256})
    if proof is not None:
        doc.update({"revision": proof.revision, "keys": proof.keys, "storedRevisions": proof.stored_revisions,
                    "objects": list(proof.objects), "etcdVersion": proof.etcd_version, "seconds": proof.seconds})
    if problem:
        doc["problem"] = problem
    return doc


def read_record(doc: object) -> tuple[bool, dt.datetime] | None:
    """(ok, verifiedAt) of a sidecar, or None when it is not one of ours."""
    if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION or not isinstance(doc.get("ok"), bool):
        return None
    try:
        at = dt.datetime.strptime(str(doc.get("verifiedAt")), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return None
    return doc["ok"], at


def _plaintext(path, key: str):
    with open(path, "rb") as f:
        _, chunks = sealed.open_segments(f, key)
        check = SnapshotCheck()
        for chunk in chunks:
            check.update(chunk)
            yield chunk
        check.finish()


def verify(access: ZoneAccess, store, name: str, *, timeout: float = scratch_etcd.DEFAULT_TIMEOUT,
           address: str = "127.0.0.1", now: dt.datetime | None = None,
           log: Callable[[str], None] = lambda m: None) -> dict:
    """Verify backup `name` of `store`, record the result beside it and return the record; a
    failed verification raises BackupError after recording it."""
    at = now or dt.datetime.now(dt.timezone.utc)
    checked, fetched = None, False
    try:
        with store.local(name) as path:
            fetched = path.exists()
            checked = restore.verify(path, access)
            log(f"verify {store.describe(name)}: sealed file intact ({checked.size} bytes of snapshot); restoring "
                "it into a scratch etcd")
            proof = scratch_etcd.prove(_plaintext(path, access.require_key()), timeout=timeout, address=address)
    except BackupError as e:
        if fetched:  # the file is there but does not hold up: say so beside it
            store.put_json(files.verified_name(name), record(name, ok=False, at=at, checked=checked, problem=str(e)))
        raise
    doc = record(name, ok=True, at=at, proof=proof, checked=checked)
    store.put_json(files.verified_name(name), doc)
    return doc


def newest(store, cluster: str) -> tuple[str | None, str | None, dt.datetime | None]:
    """(newest backup, newest backup verified to restore, when that was verified)."""
    found = newest_with_failures(store, cluster)
    return found[0], found[1], found[2]


def newest_with_failures(store, cluster: str) -> tuple[str | None, str | None, dt.datetime | None, bool]:
    """newest() and whether the newest backup's own verification failed (an alert, not a gap)."""
    names = store.names()
    found = files.finished(names, cluster)
    latest_failed = False
    for name in reversed(found):
        if files.verified_name(name) in names:
            seen = read_record(store.get_json(files.verified_name(name)))
            if seen and seen[0]:
                return found[-1], name, seen[1], latest_failed
            latest_failed = latest_failed or (seen is not None and name == found[-1])
    return (found[-1] if found else None), None, None, latest_failed
