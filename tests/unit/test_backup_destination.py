"""Backups shipped and proven (issue 30): the destination URL, the zone's backup credential, the
verification record beside a file, and what `status` makes of a folder of backups."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from kontinuum.backup import credential, destination, files, verify
from kontinuum.backup.store import FolderStore, S3Store, for_file, for_zone
from kontinuum.backup.zone import BackupError
from kontinuum.fleet_status import Observation, backup_text
from kontinuum.stackconfig import contract
from kontinuum.stackconfig.schema import check
from kontinuum.talos import secrets, talosconfig

BUNDLE = secrets.dump(secrets.generate())
NOW = dt.datetime(2026, 12, 2, 12, tzinfo=dt.timezone.utc)


def test_an_s3_url_takes_the_state_backends_parameters():
    loc = destination.parse_s3("s3://backups/kontinuum/prod?endpoint=http://127.0.0.1:8333&s3ForcePathStyle=true"
                               "&region=eu-central-1")
    assert (loc.bucket, loc.prefix, loc.endpoint, loc.path_style, loc.region) == (
        "backups", "kontinuum/prod", "http://127.0.0.1:8333", True, "eu-central-1")
    assert destination.parse_s3("s3://b?use_path_style=true").path_style  # the newer spelling
    assert not destination.parse_s3("s3://b").path_style and destination.parse_s3("s3://b").endpoint is None
    assert loc.key("eu", "eu-a", "f") == "kontinuum/prod/eu/eu-a/f"
    again = destination.parse_s3(loc.url(loc.key("x")))  # a file's URL reaches the same store
    assert (again.bucket, again.prefix, again.endpoint, again.path_style, again.region) == (
        "backups", "kontinuum/prod/x", loc.endpoint, True, loc.region)


@pytest.mark.parametrize("url, said", [
    ("s3://b?endpont=http://x", "unknown parameter 'endpont'"),
    ("s3://key:secret@b", "may hold no credentials"),
    ("s3://b?use_path_style=yes", "must be true or false"),
    ("s3://b?endpoint=ftp://x", "must be an http:// or https:// URL"),
    ("s3:///prefix", "is not an s3://<bucket>"),
])
def test_a_wrong_s3_url_is_refused_by_name(url, said):
    with pytest.raises(BackupError, match=said):
        destination.parse_s3(url)
    assert said.split("'")[0] in destination.problem(url)


def test_the_contract_takes_a_folder_or_an_s3_url_and_refuses_other_schemes():
    backup = contract.ZONE.fields["backup"]
    errors = []
    check(backup, {"destination": "s3://b/p?endpoint=http://127.0.0.1:8333&use_path_style=true"}, "b", errors)
    check(backup, {"destination": "/srv/backups"}, "b", errors)
    assert errors == []
    check(backup, {"destination": "gs://b"}, "zones[0].backup", errors)
    assert [(e.path, "gs:// is not supported" in str(e)) for e in errors] == [("zones[0].backup.destination", True)]


def test_a_stack_gives_destination_or_its_older_name_directory_not_both():
    from kontinuum.stackconfig.parse import _backup_destination

    said = []

    class Errs:
        def add(self, path, text):
            said.append((path, text))

    assert _backup_destination({"directory": "/d"}, "zones[0]", Errs()) == "/d"
    assert _backup_destination({}, "zones[0]", Errs()) == files.DEFAULT_DIRECTORY
    _backup_destination({"directory": "/d", "destination": "s3://b"}, "zones[0]", Errs())
    assert said == [("zones[0].backup.directory", "give `destination` or its older name `directory`, not both")]


def test_a_zone_store_is_a_folder_or_a_bucket_under_stack_and_zone(tmp_path):
    folder = for_zone(tmp_path, "org/eu", "eu-a")
    assert isinstance(folder, FolderStore) and folder.folder == tmp_path / "eu" / "eu-a"
    bucket = for_zone("s3://b/p?endpoint=http://127.0.0.1:8333&use_path_style=true", "eu", "eu-a")
    assert isinstance(bucket, S3Store) and bucket.describe("f") == \
        "s3://b/p/eu/eu-a/f?endpoint=http://127.0.0.1:8333&use_path_style=true"
    store, name = for_file(bucket.describe("f"))
    assert (store.where, name) == ("p/eu/eu-a", "f")
    with pytest.raises(BackupError, match="give the whole object key"):
        for_file("s3://b/f")


def test_the_backup_credential_is_os_etcd_backup_only_and_renewed_when_stale():
    cred = credential.issue("eu-a", BUNDLE, ["10.0.0.1"])
    cert = x509.load_pem_x509_certificate(talosconfig.parse(cred).crt)
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["os:etcd:backup"]
    assert talosconfig.parse(cred).endpoints == ["10.0.0.1"]
    assert not credential.stale(cred, BUNDLE, ["10.0.0.1"])
    assert credential.stale(cred, BUNDLE, ["10.0.0.1", "10.0.0.2"])  # the control planes changed
    assert credential.stale(cred, secrets.dump(secrets.generate()), ["10.0.0.1"])  # another (rotated) CA
    soon = credential.issue("eu-a", BUNDLE, ["10.0.0.1"], now=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=350))
    assert credential.stale(soon, BUNDLE, ["10.0.0.1"])  # within 30 days of expiry
    assert not credential.stale(soon, BUNDLE, ["10.0.0.1"], renew_before_days=10)  # certificates.renewBefore
    assert credential.stale(None, BUNDLE, ["10.0.0.1"])


def _put(store: FolderStore, name: str, ok: bool | None) -> None:
    store.folder.mkdir(parents=True, exist_ok=True)
    (store.folder / name).write_bytes(b"x")
    if ok is not None:
        store.put_json(files.verified_name(name), verify.record(name, ok=ok, at=NOW))


def test_the_newest_verified_backup_is_found_beside_the_files(tmp_path):
    store = FolderStore(tmp_path)
    names = [files.file_name("eu-a", NOW - dt.timedelta(hours=h)) for h in (30, 20, 3)]
    assert verify.newest(store, "eu-a") == (None, None, None)
    _put(store, names[0], True)
    _put(store, names[1], False)  # verified and failed: not "verified"
    _put(store, names[2], None)
    (tmp_path / "eu-a-garbage.verified.json").write_text("{")
    assert verify.newest(store, "eu-a") == (names[2], names[0], NOW)
    assert verify.read_record({"version": 1, "ok": True, "verifiedAt": "yesterday"}) is None
    assert files.taken_at(names[0]) == NOW - dt.timedelta(hours=30)

    o = Observation("eu-a", backup_at=files.taken_at(names[2]), verified_at=files.taken_at(names[0]))
    assert backup_text(o, NOW) == "3 h old; newest verified 30 h old"
    o.backup_verified = True
    assert backup_text(o, NOW) == "3 h old, verified"
    assert backup_text(Observation("eu-a", backup_problem="x"), NOW) == "unreadable"


def test_pruning_takes_the_verification_record_along(tmp_path):
    store = FolderStore(tmp_path)
    names = [files.file_name("eu-a", NOW - dt.timedelta(hours=h)) for h in (3, 2, 1)]
    for n in names:
        _put(store, n, True)
    gone = files.prune_store(store, "eu-a", 2)
    assert gone == [str(tmp_path / names[0])]
    assert sorted(store.names()) == sorted([names[1], names[2], *(files.verified_name(n) for n in names[1:])])


def test_a_record_says_what_was_proven_and_nothing_secret():
    from kontinuum.backup.scratch_etcd import Proof

    doc = verify.record("f", ok=True, at=NOW, proof=Proof(42, 300, 900, ("/registry/namespaces/kube-system",),
                                                          "3.6.5", 1.5))
    assert doc == {"version": 1, "file": "f", "ok": True, "verifiedAt": "2026-12-02T12:00:00Z", "revision": 42,
                   "keys": 300, "storedRevisions": 900, "objects": ["/registry/namespaces/kube-system"],
                   "etcdVersion": "3.6.5", "seconds": 1.5}
    assert verify.read_record(doc) == (True, NOW)


def test_a_newest_backup_that_failed_its_verification_is_a_warning(tmp_path):
    from kontinuum.fleet_status import WARNING, judge

    store = FolderStore(tmp_path)
    names = [files.file_name("eu-a", NOW - dt.timedelta(hours=h)) for h in (30, 3)]
    _put(store, names[0], True)
    _put(store, names[1], False)
    assert verify.newest_with_failures(store, "eu-a") == (names[1], names[0], NOW, True)
    _put(store, names[1], None)  # an older failure does not count against a newer file
    (tmp_path / files.verified_name(names[1])).unlink()
    _put(store, names[0], False)
    assert verify.newest_with_failures(store, "eu-a") == (names[1], None, None, False)

    o = Observation("eu-a", backup_at=files.taken_at(names[1]), backup_path=names[1], backup_failed=True)
    z = judge(o, now=NOW, renew_before=dt.timedelta(days=30), backup_max_age=dt.timedelta(hours=26))
    assert z.level == WARNING and any("failed its verification" in f.text for f in z.findings), z.findings
