"""Backups shipped and proven, over real sockets: the S3 store against the lab's SeaweedFS
(upload, list, download, the verification record, pruning; wrong credentials and a dead store
refused by name, bounded), and verification of a real Kubernetes etcd's snapshot with the real
etcdutl and etcd (a kube-apiserver wrote it). Addresses 127.0.66.0/24 are this module's own."""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time
from pathlib import Path

import pytest

from kontinuum.backup import files, sealed, verify
from kontinuum.backup.store import for_zone
from kontinuum.backup.zone import BackupError, ZoneAccess, identity
from kontinuum.talos import secrets
from lab.controlplane import ClusterPKI, ControlPlane, free_port
from lab.s3 import running_s3

S3_ADDRESS, APISERVER, SCRATCH, OTHER_S3 = "127.0.66.2", "127.0.66.3", "127.0.66.4", "127.0.66.5"
CLUSTER = "eu-a"
NOW = dt.datetime(2026, 12, 2, 6, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def s3(tools_bin, tmp_path_factory):
    with running_s3(tmp_path_factory.mktemp("s3"), address=S3_ADDRESS, bucket="kontinuum-backups", ttl=900) as server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())  # the standard AWS variables, as a CI job sets them
        yield server
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def zone(tools_bin, tmp_path_factory):
    """A real etcd written by a real kube-apiserver, and a zone identity whose key seals it."""
    cp = ControlPlane("verify", tmp_path_factory.mktemp("cp"), ClusterPKI.generate(), address=APISERVER,
                      apiserver_port=free_port(APISERVER), etcd_ports=(free_port(APISERVER), free_port(APISERVER)))
    cp.start()
    try:
        snapshot = cp.etcd_snapshot()
    finally:
        cp.stop()
    bundle = secrets.dump(secrets.generate())
    access = ZoneAccess(cluster=CLUSTER, talosconfig="", secrets_yaml=bundle, control_planes=("10.0.0.1",),
                        key=sealed.new_key())
    return access, snapshot


def url(s3, prefix: str = "fleet") -> str:
    """As a stack would write it, with the state backend's older path-style spelling."""
    return f"s3://{s3.bucket}/{prefix}?endpoint={s3.endpoint}&s3ForcePathStyle=true&region=us-east-1"


def sealed_file(access: ZoneAccess, snapshot: bytes, store, when: dt.datetime) -> str:
    who = identity(access.secrets_yaml)
    name = files.file_name(CLUSTER, when)
    part = store.stage(name)
    with open(part, "wb") as out:
        sealer = sealed.Sealer(out, access.key, sealed.Header(
            zone=CLUSTER, created=when.strftime("%Y-%m-%dT%H:%M:%SZ"), key_id=sealed.key_id(access.key),
            cluster_id_sha256=who.cluster_id_sha256, etcd_ca_sha256=who.etcd_ca_sha256, node="10.0.0.1"))
        sealer.write(snapshot)
        sealer.close()
    store.commit(part, name)
    return name


def test_the_bucket_store_uploads_lists_downloads_and_prunes(s3, tmp_path):
    store = for_zone(url(s3), "org/eu", CLUSTER)
    assert store.names() == []
    names = []
    for hours in (3, 2, 1):
        name = files.file_name(CLUSTER, NOW - dt.timedelta(hours=hours))
        part = store.stage(name)
        part.write_bytes(name.encode())
        assert store.commit(part, name).startswith(f"s3://{s3.bucket}/fleet/eu/{CLUSTER}/{name}?endpoint=")
        assert not part.exists()  # the local staging copy is gone once uploaded
        names.append(name)
    store.put_json(files.verified_name(names[0]), verify.record(names[0], ok=True, at=NOW))
    assert store.names() == sorted([*names, files.verified_name(names[0])])
    with store.local(names[1]) as local:
        assert local.read_bytes() == names[1].encode()
        kept = local
    assert not kept.exists()
    assert verify.newest(store, CLUSTER) == (names[2], names[0], NOW)
    assert store.get_json("absent.json") is None
    assert files.prune_store(store, CLUSTER, 2) == [store.describe(names[0])]
    assert store.names() == names[1:]  # the pruned file's record went with it


def test_another_s3_server_beside_it_shares_no_socket_and_leaves_the_store_writable(s3, tmp_path):
    """The lab's SeaweedFS servers run side by side in the suite. With default ports they bound the
    same unix sockets in /tmp, and the first to stop removed the other's: minutes later every write
    that needed a new connection was a 500 InternalError."""
    with running_s3(tmp_path / "other", address=OTHER_S3, bucket="other", ttl=300):
        sockets = [line.split() for line in Path("/proc/net/unix").read_text().splitlines()[1:]]
        bound = [f[7] for f in sockets if len(f) == 8 and f[3] == "00010000"  # listening
                 and ("seaweedfs" in f[7] or f[7].endswith(("/filer.sock", "/s3.sock")))]
        assert bound and len(bound) == len(set(bound)), sorted(bound)
    store = for_zone(url(s3, "neighbour"), "eu", CLUSTER)
    name = files.file_name(CLUSTER, NOW)
    part = store.stage(name)
    part.write_bytes(b"written after the neighbour stopped")
    store.commit(part, name)
    assert store.names() == [name]


def test_wrong_credentials_and_a_dead_store_are_refused_by_name_in_bounded_time(s3, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(BackupError) as refused:
        for_zone(url(s3), "eu", CLUSTER).names()
    assert f"s3://{s3.bucket}/fleet/eu/{CLUSTER}: the store answered" in str(refused.value)
    assert "not-the-secret" not in str(refused.value) and s3.secret_key not in str(refused.value)
    monkeypatch.undo()
    dead = f"s3://{s3.bucket}?endpoint=http://127.0.66.250:9&use_path_style=true&region=us-east-1"
    started = time.monotonic()
    with pytest.raises(BackupError, match="127.0.66.250:9: .*check the endpoint"):
        for_zone(dead, "eu", CLUSTER).names()
    assert time.monotonic() - started < 60


def test_a_backup_in_the_bucket_is_verified_by_a_real_restore_and_recorded_beside_it(s3, zone):
    access, snapshot = zone
    store = for_zone(url(s3, "verify"), "eu", CLUSTER)
    name = sealed_file(access, snapshot, store, NOW)
    started = time.monotonic()
    doc = verify.verify(access, store, name, address=SCRATCH, timeout=120, now=NOW)
    took = time.monotonic() - started
    assert doc["ok"] and doc["revision"] > 1 and doc["keys"] > 10, doc
    assert "/registry/namespaces/kube-system" in doc["objects"]
    assert store.get_json(files.verified_name(name)) == doc
    assert verify.newest(store, CLUSTER) == (name, name, NOW)
    assert not list(Path(tempfile.gettempdir()).glob("kontinuum-verify-*")), "the scratch folder was left behind"
    assert took < 120


def test_a_damaged_backup_is_recorded_as_not_restoring(s3, zone):
    access, snapshot = zone
    store = for_zone(url(s3, "damaged"), "eu", CLUSTER)
    name = sealed_file(access, snapshot, store, NOW)
    with store.local(name) as local:
        data = bytearray(local.read_bytes())
        data[len(data) // 2] ^= 1
        local.write_bytes(bytes(data))
        part = store.stage(name)
        part.write_bytes(bytes(data))
    store.commit(part, name)
    with pytest.raises(BackupError, match="is refused"):
        verify.verify(access, store, name, address=SCRATCH, timeout=60, now=NOW)
    record = store.get_json(files.verified_name(name))
    assert record["ok"] is False and "is refused" in record["problem"]
    assert verify.newest(store, CLUSTER) == (name, None, None)
