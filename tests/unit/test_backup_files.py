"""The etcd backup file (kontinuum/backup): snapshot checks, the sealed format, naming and
retention, reading a zone from a stack export, and the EtcdBackup resource's plan."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import struct

import pytest

from kontinuum.backup import files, sealed
from kontinuum.talos import secrets
from kontinuum.backup.snapshot import SnapshotCheck, SnapshotInvalid, check
from kontinuum.backup.stack_state import zone_access
from kontinuum.backup.zone import BackupError
from providers.etcd_backup import EtcdBackupProvider


def snapshot(pages: int = 4) -> bytes:
    db = bytearray(4096 * pages)
    struct.pack_into("<I", db, 16, 0xED0CDAED)
    db[5000:5010] = b"configmaps"
    return bytes(db) + hashlib.sha256(db).digest()


BUNDLE = secrets.dump(secrets.generate())
HEADER = sealed.Header(zone="eu-a", created="2026-12-01T06:00:00Z", key_id="", cluster_id_sha256="c" * 64,
                       etcd_ca_sha256="e" * 64, node="10.0.0.1")


def seal(data: bytes, key: str, chunk: int = 7000) -> bytes:
    out = io.BytesIO()
    s = sealed.Sealer(out, key, sealed.Header(**{**HEADER.__dict__, "key_id": sealed.key_id(key)}))
    for i in range(0, len(data), chunk):
        s.write(data[i:i + chunk])
    s.close()
    return out.getvalue()


def unseal(blob: bytes, key: str) -> bytes:
    _, chunks = sealed.open_segments(io.BytesIO(blob), key)
    return b"".join(chunks)


def test_snapshot_checks_streamed_in_any_chunking():
    data = snapshot()
    for size in (1, 31, 32, 33, 4096, len(data)):
        c = SnapshotCheck()
        for i in range(0, len(data), size):
            c.update(data[i:i + size])
        assert c.finish() == (len(data), data[-32:].hex())


@pytest.mark.parametrize("mangle, why", [
    (lambda d: d[:-100], "not a multiple of 512"),
    (lambda d: d[:-4096], "sha256 trailer does not match"),  # cut at a page boundary: the hash tells
    (lambda d: d[:5000] + b"X" + d[5001:], "sha256 trailer does not match"),
    (lambda d: b"\0" * 32 + d[32:], "not an etcd \\(bbolt\\) database"),
    (lambda d: d[:100], "too short"),
])
def test_bad_snapshots_are_named(mangle, why):
    with pytest.raises(SnapshotInvalid, match=why):
        check(mangle(snapshot()))


def test_sealed_round_trip_across_segments(monkeypatch):
    monkeypatch.setattr(sealed, "SEGMENT", 4096)
    key, data = sealed.new_key(), snapshot(5)
    blob = seal(data, key)
    assert data[5000:5010] not in blob
    assert unseal(blob, key) == data
    assert unseal(seal(b"", key), key) == b""


@pytest.mark.parametrize("mangle, why", [
    (lambda b: b[:-1], "truncated"),
    (lambda b: b[:-(32 + 16 + 4)], "last segment is missing"),  # the final segment (the trailer) cut off
    (lambda b: b + b"x", "data after its last segment"),
    (lambda b: b[:-10] + bytes([b[-10] ^ 1]) + b[-9:], "segment 2 fails authentication"),
    (lambda b: b.replace(b'"eu-a"', b'"eu-b"'), "segment 0 fails authentication"),
    (lambda b: b"\0" + b[1:], "not a Kontinuum etcd backup"),
])
def test_tampering_truncation_and_appending_are_refused(monkeypatch, mangle, why):
    monkeypatch.setattr(sealed, "SEGMENT", 4096)
    key = sealed.new_key()
    blob = seal(snapshot(2), key)
    with pytest.raises(sealed.SealedFileError, match=why):
        unseal(mangle(blob), key)


def test_another_key_is_told_apart_from_corruption():
    blob = seal(snapshot(), sealed.new_key())
    with pytest.raises(sealed.SealedFileError, match="sealed with another backup key"):
        unseal(blob, sealed.new_key())
    with pytest.raises(sealed.SealedFileError, match="not 32 bytes"):
        sealed.key_id("c2hvcnQ=")


def test_names_sort_by_time_and_prune_keeps_the_newest(tmp_path):
    base = dt.datetime(2026, 12, 1, 6, 0, tzinfo=dt.timezone.utc)
    for i in range(5):
        (tmp_path / files.file_name("eu-a", base + dt.timedelta(hours=i))).write_bytes(b"x")
    (tmp_path / files.file_name("eu-ab", base)).write_bytes(b"x")  # another zone's, untouched
    (tmp_path / (files.file_name("eu-a", base) + ".part")).write_bytes(b"x")
    gone = files.prune(tmp_path, "eu-a", 2)
    assert [p.name for p in files.backups(tmp_path, "eu-a")] == ["eu-a-20261201T090000Z.etcd.sealed",
                                                                 "eu-a-20261201T100000Z.etcd.sealed"]
    assert len(gone) == 4 and (tmp_path / files.file_name("eu-ab", base)).exists()


def res(urn_type: str, name: str, parent: str = "", custom: bool = True, **outputs) -> dict:
    return {"urn": f"urn:pulumi:eu::kontinuum::{urn_type}::{name}", "type": urn_type.rsplit("$", 1)[-1],
            "custom": custom, "parent": parent, "outputs": outputs}


def test_zone_access_from_a_stack_export():
    cluster = "urn:pulumi:eu::kontinuum::kontinuum:index:Zone$kontinuum:index:TalosCluster::eu-a"
    dyn = "kontinuum:index:Zone$kontinuum:index:TalosCluster$pulumi-python:dynamic:Resource"
    deployment = {"resources": [
        res("pulumi:pulumi:Stack", "kontinuum-eu", custom=False, region="eu"),
        res("kontinuum:index:Zone", "eu-a", custom=False),
        res(dyn, "eu-a-secrets", cluster, talosconfig={"plaintext": '"tc"'}, secretsYaml="sy",
            endpoints=["10.0.0.1", "10.0.0.2"]),
        res(dyn, "eu-a-1a2b3c4d", cluster, role="worker", address="10.0.0.9", talosPort=50001),
        res(dyn, "eu-a-5e6f7a8b", cluster, role="controlplane", address="10.0.0.1", talosPort=50001),
        res("kontinuum:index:Zone$pulumi-python:dynamic:Resource", "eu-a-etcd-backup", key="k",
            directory="/b", keep=3, backupTalosconfig="btc"),
    ]}
    access, settings = zone_access(deployment, "eu", "a")
    assert (access.cluster, access.talosconfig, access.control_planes, access.workers, access.talos_port,
            access.key) == ("eu-a", "tc", ("10.0.0.1", "10.0.0.2"), ("10.0.0.9",), 50001, "k")
    assert (settings.destination, settings.keep, access.backup_talosconfig) == ("/b", 3, "btc")  # older state
    with pytest.raises(BackupError, match=r"stack eu has no zone 'b' \(zones in its state: a\)"):
        zone_access(deployment, "eu", "b")


def test_backup_resource_updates_on_every_up_only_with_on_up():
    p = EtcdBackupProvider()
    props = {"cluster": "eu-a", "destination": "/b", "keep": 7, "onUp": False, "key": "k", "secretsYaml": BUNDLE,
             "renewBeforeDays": 30, "controlPlanes": ["10.0.0.1"]}
    created = p.create({**props}).outs
    assert len(created["key"]) == 44 and "lastBackup" not in created
    held = {**props, "backupTalosconfig": created["backupTalosconfig"]}
    assert not p.diff("eu-a", held, dict(props)).changes
    assert p.diff("eu-a", held, {**props, "keep": 3}).changes
    assert p.diff("eu-a", {**held, "onUp": True}, {**props, "onUp": True}).changes
    assert p.diff("eu-a", props, dict(props)).changes  # state of an older version: no credential yet
    assert p.diff("eu-a", held, {**props, "renewBeforeDays": 400}).changes  # a changed renewBefore is an update
    assert p.update("eu-a", {**held, "key": "old"}, props).outs["key"] == "old"

