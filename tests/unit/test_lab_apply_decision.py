"""The emulator's live-or-reboot decision (lab/talos_node/apply_decision.py), field by field, as
Talos 1.13's CanApplyImmediate makes it, and the mode each requested mode resolves to."""

from __future__ import annotations

import copy

import pytest
import yaml

from lab.talos_node import apply_decision as ad

BASE = {
    "version": "v1alpha1",
    "debug": False,
    "persist": True,
    "machine": {
        "type": "controlplane",
        "token": "abcdef.0123456789abcdef",
        "ca": {"crt": "Q1JU", "key": "S0VZ"},
        "certSANs": ["10.0.0.1"],
        "kubelet": {"image": "ghcr.io/siderolabs/kubelet:v1.34.1"},
        "network": {"hostname": "cp-1"},
        "install": {"disk": "/dev/sda", "image": "ghcr.io/siderolabs/installer:v1.13.0"},
        "features": {"rbac": True, "stableHostname": True, "kubePrism": {"enabled": True, "port": 7445}},
    },
    "cluster": {"id": "abc", "clusterName": "eu-a", "controlPlane": {"endpoint": "https://10.0.0.1:6443"}},
}
KUBESPAN = {"apiVersion": "v1alpha1", "kind": "KubeSpanConfig", "enabled": False}


def dump(doc: dict, *more: dict) -> str:
    return yaml.safe_dump_all([doc, *more], sort_keys=False)


def changed(path: str, value: object) -> dict:
    """BASE with the dotted `path` set to `value` (None removes the key)."""
    doc = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    parent = doc
    for key in parents:
        parent = parent.setdefault(key, {})
    if value is None:
        parent.pop(leaf, None)
    else:
        parent[leaf] = value
    return doc


LIVE = [
    ("debug", True),
    ("cluster.clusterName", "eu-b"),
    ("cluster.apiServer", {"image": "registry.k8s.io/kube-apiserver:v1.35.0"}),
    ("cluster.acceptedCAs", [{"crt": "T0xE"}]),
    ("machine.ca", {"crt": "TkVX", "key": "TktFWQ=="}),
    ("machine.acceptedCAs", [{"crt": "T0xE"}]),
    ("machine.time", {"servers": ["time.cloudflare.com"]}),
    ("machine.certSANs", ["10.0.0.1", "kube.example.test"]),
    ("machine.install", {"disk": "/dev/sda", "image": "ghcr.io/siderolabs/installer:v1.13.2"}),
    ("machine.network", {"hostname": "cp-one"}),
    ("machine.sysfs", {"devices.system.cpu.cpu0.cpufreq.scaling_governor": "performance"}),
    ("machine.sysctls", {"net.core.somaxconn": "65535"}),
    ("machine.logging", {"destinations": [{"endpoint": "udp://10.0.0.9:514", "format": "json_lines"}]}),
    ("machine.controlPlane", {"scheduler": {"disabled": True}}),
    ("machine.kubelet", {"image": "ghcr.io/siderolabs/kubelet:v1.35.0"}),
    ("machine.kernel", {"modules": [{"name": "br_netfilter"}]}),
    ("machine.registries", {"mirrors": {"docker.io": {"endpoints": ["https://mirror.test"]}}}),
    ("machine.pods", [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}]),
    ("machine.seccompProfiles", [{"name": "audit.json", "value": {"defaultAction": "SCMP_ACT_LOG"}}]),
    ("machine.nodeAnnotations", {"example.test/a": "b"}),
    ("machine.nodeLabels", {"zone": "a"}),
    ("machine.nodeTaints", {"dedicated": "db:NoSchedule"}),
    ("machine.features.kubernetesTalosAPIAccess", {"enabled": True, "allowedRoles": ["os:reader"]}),
    ("machine.features.kubePrism", {"enabled": False}),
    ("machine.features.hostDNS", {"enabled": True}),
    ("machine.features.imageCache", {"localEnabled": True}),
    ("machine.features.nodeAddressSortAlgorithm", "v2"),
]
REBOOT = [
    ("persist", False),
    ("machine.type", "worker"),
    ("machine.token", "fedcba.0123456789abcdef"),
    ("machine.files", [{"path": "/var/f", "content": "x", "op": "create"}]),
    ("machine.env", {"HTTP_PROXY": "http://proxy.test:3128"}),
    ("machine.disks", [{"device": "/dev/sdb", "partitions": [{"mountpoint": "/var/mnt/b"}]}]),
    ("machine.udev", {"rules": ["SUBSYSTEM==\"drm\", GROUP=\"video\""]}),
    ("machine.systemDiskEncryption", {"state": {"provider": "luks2"}}),
    ("machine.baseRuntimeSpecOverrides", {"process": {"rlimits": []}}),
    ("machine.features.rbac", False),
    ("machine.features.stableHostname", None),
    ("machine.features.apidCheckExtKeyUsage", True),
    ("machine.features.diskQuotaSupport", True),
]


@pytest.mark.parametrize("path,value", LIVE, ids=[p for p, _ in LIVE])
def test_a_live_field_applies_without_a_reboot(path, value):
    decision = ad.decide(dump(BASE), dump(changed(path, value)))
    assert decision.live and decision.reason == ""


@pytest.mark.parametrize("path,value", REBOOT, ids=[p for p, _ in REBOOT])
def test_any_other_field_needs_a_reboot_and_the_diff_names_it(path, value):
    decision = ad.decide(dump(BASE), dump(changed(path, value)))
    leaf = path.rsplit(".", 1)[-1]
    assert not decision.live
    assert decision.reason.startswith("this config change can't be applied in immediate mode\ndiff:\n--- a\n+++ b\n")
    assert leaf in decision.reason


def test_live_fields_changed_together_with_a_reboot_field_leave_only_that_field_in_the_diff():
    new = changed("machine.files", [{"path": "/var/f", "content": "x", "op": "create"}])
    new["machine"]["kubelet"] = {"image": "ghcr.io/siderolabs/kubelet:v1.35.0"}
    new["cluster"]["clusterName"] = "eu-b"
    decision = ad.decide(dump(BASE), dump(new))
    assert not decision.live and "files" in decision.reason
    assert "kubelet" not in "".join(line for line in decision.reason.splitlines() if line[:1] in "+-")


@pytest.mark.parametrize("old,new", [(BASE, changed("machine.features", None)), (changed("machine.features", None), BASE)],
                         ids=["removed", "added"])
def test_adding_or_removing_the_features_block_needs_a_reboot(old, new):
    assert not ad.decide(dump(old), dump(new)).live


def test_live_features_are_copied_only_when_both_blocks_exist():
    without = changed("machine.features", None)
    only_kubeprism = changed("machine.features", {"kubePrism": {"enabled": True}})
    assert not ad.decide(dump(without), dump(only_kubeprism)).live


def test_other_documents_never_force_a_reboot():
    assert ad.decide(dump(BASE), dump(BASE, KUBESPAN)).live
    assert ad.decide(dump(BASE, KUBESPAN), dump(BASE, {**KUBESPAN, "enabled": True})).live


def test_a_config_without_a_v1alpha1_document_is_never_live():
    assert ad.decide(dump(BASE), dump(KUBESPAN)) == ad.Decision(False, "new config is not v1alpha1")


def test_null_is_absent_but_empty_is_not():
    assert ad.decide(dump(BASE), dump(changed("machine.files", None))).live
    with_null = changed("machine.env", None)
    with_null["machine"]["env"] = None
    assert ad.decide(dump(BASE), dump(with_null)).live
    assert not ad.decide(dump(BASE), dump(changed("machine.files", []))).live


def test_formatting_alone_is_no_change():
    flow = yaml.safe_dump(BASE, default_flow_style=True)
    assert ad.decide(dump(BASE), flow).live and ad.config_diff(dump(BASE), flow) == ""


def test_auto_resolves_to_reboot_with_the_reason_or_to_no_reboot():
    reboot = ad.resolve("auto", dump(BASE), dump(changed("machine.env", {"A": "b"})))
    assert reboot.mode == "reboot" and reboot.summary == "Applied configuration with a reboot"
    assert reboot.details.startswith("Applied configuration with a reboot: this config change can't be applied")
    live = ad.resolve("auto", dump(BASE), dump(changed("machine.nodeLabels", {"a": "b"})))
    assert (live.mode, live.details) == ("no-reboot", "Applied configuration without a reboot")


@pytest.mark.parametrize("mode", ["no-reboot", "try"])
def test_no_reboot_and_try_refuse_a_change_that_needs_a_reboot(mode):
    with pytest.raises(ad.RefusedLive, match=r"(?s)can't be applied in immediate mode\ndiff:\n.*HTTP_PROXY"):
        ad.resolve(mode, dump(BASE), dump(changed("machine.env", {"HTTP_PROXY": "x"})))
    assert ad.resolve(mode, dump(BASE), dump(changed("machine.nodeLabels", {"a": "b"}))).mode == mode


@pytest.mark.parametrize("mode", ["reboot", "staged"])
def test_reboot_and_staged_take_any_change(mode):
    assert ad.resolve(mode, dump(BASE), dump(changed("machine.env", {"A": "b"}))).mode == mode


def test_a_dry_run_shows_the_summary_and_the_whole_diff():
    new = dump(BASE, KUBESPAN)
    details = ad.dry_run_details(ad.resolve("auto", dump(BASE), new), dump(BASE), new)
    assert details.startswith("Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\n"
                              "Config diff:\n\n--- a\n+++ b\n")
    assert "+kind: KubeSpanConfig\n" in details
    same = ad.dry_run_details(ad.resolve("auto", dump(BASE), dump(BASE)), dump(BASE), dump(BASE))
    assert same.endswith("Config diff:\n\nNo changes.")
    rebooting = ad.resolve("auto", dump(BASE), dump(changed("machine.env", {"A": "b"})))
    assert "immediate mode" not in ad.dry_run_details(rebooting, dump(BASE), dump(changed("machine.env", {"A": "b"})))
