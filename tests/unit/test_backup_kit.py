"""The backup kit: a job's whole need of a zone, read back as it was written, refused clearly when
it is not one."""

from __future__ import annotations

import pytest

from kontinuum.backup import kit
from kontinuum.backup.errors import BackupError
from kontinuum.backup.stack_state import BackupSettings
from kontinuum.backup.zone import ZoneAccess, identity
from kontinuum.talos import secrets


def test_a_kit_reads_back_with_the_identity_instead_of_the_bundle(tmp_path):
    bundle_yaml = secrets.dump(secrets.generate())
    access = ZoneAccess(cluster="eu-a", talosconfig="admin", secrets_yaml=bundle_yaml, control_planes=("10.0.0.5",),
                        talos_port=50000, key="a2V5", backup_talosconfig="backup-only")
    entry = kit.zone_entry(access, BackupSettings("s3://b/p", 3), "/unused", 7)
    path = tmp_path / "kit"
    kit.write(path, kit.render("eu", {"a": entry}))
    assert path.stat().st_mode & 0o777 == 0o600
    assert "admin" not in path.read_text() and bundle_yaml not in path.read_text()
    stack, zones = kit.load(path)
    loaded, settings = zones["a"]
    assert stack == "eu" and settings == BackupSettings("s3://b/p", 3)
    assert loaded.identity() == identity(bundle_yaml) and loaded.backup_talosconfig == "backup-only"
    assert loaded.control_planes == ("10.0.0.5",) and loaded.require_key() == "a2V5" and loaded.secrets_yaml == ""


def test_a_zone_without_its_backup_credential_is_refused():
    access = ZoneAccess(cluster="eu-a", talosconfig="admin", secrets_yaml="", control_planes=("10.0.0.5",), key="k")
    with pytest.raises(BackupError, match="no backup credential"):
        kit.zone_entry(access, None, "/d", 1)


@pytest.mark.parametrize("text, want", [
    ("just text", "not a kontinuum-backup-kit"),
    ("kind: kontinuum-backup-kit\nversion: 1\nstack: eu\nzones: {}\n", "holds no zone"),
    ("kind: kontinuum-backup-kit\nversion: 1\nstack: eu\nzones: {a: {cluster: eu-a}}\n", "zone 'a' lacks"),
])
def test_what_is_not_a_kit_is_refused_naming_the_file(tmp_path, text, want):
    path = tmp_path / "kit"
    path.write_text(text)
    with pytest.raises(BackupError, match=want) as e:
        kit.load(path)
    assert str(path) in str(e.value)
