"""The Talos upgrade policy (Talos 1.13's compatibility bounds) and the stack keys behind it."""

from __future__ import annotations

import pytest

from kontinuum.lifecycle.versions import parse, upgrade_problem
from kontinuum.stackconfig import parse as stack_config


@pytest.mark.parametrize(("current", "target", "allow", "expect"), [
    ("v1.13.0", "v1.13.0", False, None),
    ("v1.13.0", "v1.13.1", False, None),
    ("v1.12.4", "v1.13.1", False, None),
    ("v1.11.0", "v1.13.1", False, None),
    ("v1.10.7", "v1.13.1", False, "upgrade path starts at v1.11.0"),
    ("v1.13.2", "v1.13.1", False, "downgrade from v1.13.2; downgrades are refused unless upgrade.allowDowngrade"),
    ("v1.13.2", "v1.13.1", True, None),
    ("v1.15.0", "v1.13.1", True, "only from versions below v1.15.0"),
    ("v1.13.1", "v1.14.0", False, "not a supported target"),
    ("v1.13.0-beta.1", "v1.13.0", False, None),
])
def test_policy(current, target, allow, expect):
    problem = upgrade_problem(current, target, allow_downgrade=allow)
    assert (problem is None) if expect is None else (expect in problem)


def test_prereleases_sort_before_their_release():
    assert parse("v1.13.0-beta.1") < parse("v1.13.0") < parse("v1.13.1")


def _zone(**extra) -> dict:
    return {"region": "eu", "hub": {"dnsDomain": "k.test", "grpcEndpoint": "hub.k.test:443",
                                    "acme": {"email": "a@k.test"}, "auth": {"mode": "anonymous"}},
            "zones": [{"zone": "a", "talosAddresses": ["10.0.0.1"], **extra}]}


def test_upgrade_keys_default_and_build_the_installer_image():
    z = stack_config.parse(_zone()).zones[0]
    assert (z.upgrade.drain, z.upgrade.drain_control_planes, z.upgrade.allow_downgrade) == (True, False, False)
    assert z.upgrade.image(z.talos_version) == "ghcr.io/siderolabs/installer:v1.13.0" and z.path == "zones[0]"
    z = stack_config.parse(_zone(talosVersion="v1.13.1", upgrade={
        "installerImage": "factory.talos.dev/metal-installer/abc123", "allowDowngrade": True})).zones[0]
    assert z.upgrade.image(z.talos_version) == "factory.talos.dev/metal-installer/abc123:v1.13.1"


@pytest.mark.parametrize("bad", ["ghcr.io/siderolabs/installer:v1.13.1", "installer@sha256:00", "no-slash"])
def test_installer_image_is_a_repository_without_tag(bad):
    stack, errs = stack_config.problems(_zone(upgrade={"installerImage": bad}))
    assert [str(e) for e in errs] and str(errs[0]).startswith("zones[0].upgrade.installerImage:")


@pytest.mark.parametrize("version", ["v1.14.0", "v1.12.9"])
def test_unsupported_target_is_refused_at_config_time(version):
    _, errs = stack_config.problems(_zone(talosVersion=version))
    assert any(str(e).startswith("zones[0].talosVersion:") for e in errs)


@pytest.mark.parametrize(("current", "target", "expect"), [
    ("v1.35.4", "v1.35.4", None),
    ("v1.35.4", "v1.35.6", None),
    ("v1.35.4", "v1.36.0", None),
    ("v1.35.4", "v1.37.0", "skips a minor version"),
    ("v1.35.4", "v1.34.9", "never downgraded"),
])
def test_kubernetes_skew_one_minor_at_a_time(current, target, expect):
    from kontinuum.lifecycle.versions import kubernetes_skew_problem

    problem = kubernetes_skew_problem(current, target)
    assert (problem is None) if expect is None else (expect in problem)


def test_kubernetes_version_diff_refuses_a_skip_path_precise():
    from kontinuum.errors import ConfigError
    from providers.kubernetes_version import diff_kubernetes_version

    olds = {"version": "v1.34.2", "configPath": "zones[1]"}
    assert diff_kubernetes_version(olds, {"version": "v1.35.4", "configPath": "zones[1]"}).changes
    assert not diff_kubernetes_version(olds, {"version": "v1.34.2", "configPath": "zones[1]"}).changes
    with pytest.raises(ConfigError) as err:
        diff_kubernetes_version(olds, {"version": "v1.36.0", "configPath": "zones[1]"})
    assert str(err.value).startswith("zones[1].kubernetesVersion: the zone runs Kubernetes v1.34.2")
