"""Credentials for people (kontinuum/people.py, the talosconfig and kubeconfig commands): the
role or group asked for and nothing more, the lifetime asked for, written 0600, bad input named."""

from __future__ import annotations

import base64
import datetime as dt
import stat
from pathlib import Path

import pytest
import yaml
from cryptography.x509.oid import NameOID

from kontinuum.cli.people_common import write_private
from kontinuum.people import CredentialError, kubeconfig_for, parse_ttl, talosconfig_for
from kontinuum.talos import pki, secrets, talosconfig
from lab.controlplane import kubeconfig_text

FIXTURE = Path(__file__).parent / "fixtures" / "talosctl-secrets.yaml"
NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def bundle_yaml() -> str:
    return FIXTURE.read_text()


def subject(cert_pem: bytes, oid) -> list[str]:
    return [a.value for a in pki.load_certificate(cert_pem).subject.get_attributes_for_oid(oid)]


@pytest.mark.parametrize("text,expected", [("30m", dt.timedelta(minutes=30)), ("8h", dt.timedelta(hours=8)),
                                           ("7d", dt.timedelta(days=7)), ("365d", dt.timedelta(days=365))])
def test_ttl_takes_a_number_and_a_unit(text, expected):
    assert parse_ttl(text) == expected


@pytest.mark.parametrize("text", ["0h", "8", "1y", "366d", "-1h", "eight hours"])
def test_a_ttl_outside_the_bounds_is_refused_naming_the_flag(text):
    with pytest.raises(CredentialError, match="--ttl"):
        parse_ttl(text)


def test_a_talosconfig_carries_only_the_role_asked_for_and_expires_with_the_ttl(bundle_yaml):
    text, expires = talosconfig_for("eu-a", bundle_yaml, ["10.0.0.1", "10.0.0.2"], role="os:reader",
                                    ttl=dt.timedelta(hours=8), now=NOW)
    config = talosconfig.parse(text)
    assert subject(config.crt, NameOID.ORGANIZATION_NAME) == ["os:reader"]
    assert expires == NOW + dt.timedelta(hours=8)
    assert config.endpoints == ["10.0.0.1", "10.0.0.2"] and config.context == "reader@eu-a"
    assert config.ca == secrets.load(bundle_yaml, check_rsa=False).os.crt


def test_a_talosconfig_role_outside_talos_roles_is_refused(bundle_yaml):
    with pytest.raises(CredentialError, match="--role os:root"):
        talosconfig_for("eu-a", bundle_yaml, ["10.0.0.1"], role="os:root", ttl=dt.timedelta(hours=1))


def test_a_kubeconfig_is_the_person_in_one_group_never_system_masters(bundle_yaml):
    bundle = secrets.load(bundle_yaml, check_rsa=False)
    admin = kubeconfig_text("eu-a", "https://10.0.0.1:6443", bundle.k8s.crt, pki.issue_cert(
        bundle.k8s, common_name="admin", organizations=["system:masters"], client=True, key_type="ecdsa"))
    text, expires = kubeconfig_for(admin, bundle_yaml, user="ada", group="kontinuum:view",
                                   ttl=dt.timedelta(hours=2), now=NOW)
    doc = yaml.safe_load(text)
    crt = base64.b64decode(doc["users"][0]["user"]["client-certificate-data"])
    assert subject(crt, NameOID.COMMON_NAME) == ["ada"]
    assert subject(crt, NameOID.ORGANIZATION_NAME) == ["kontinuum:view"]
    assert expires == NOW + dt.timedelta(hours=2)
    assert doc["clusters"][0]["cluster"]["server"] == "https://10.0.0.1:6443"
    with pytest.raises(CredentialError, match="--group system:masters"):
        kubeconfig_for(admin, bundle_yaml, user="ada", group="system:masters", ttl=dt.timedelta(hours=1))
    with pytest.raises(CredentialError, match="--user"):
        kubeconfig_for(admin, bundle_yaml, user="system:admin", group="kontinuum:view", ttl=dt.timedelta(hours=1))


def test_a_credential_file_is_written_0600(tmp_path):
    path = tmp_path / "cred"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "secret"
