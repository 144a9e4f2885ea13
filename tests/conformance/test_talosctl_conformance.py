"""Talos's own CLI (talosctl v1.13.0, built by `tools/install.sh talosctl`) runs its day-2 flows
against an emulated lab cluster as an operator runs them against Talos: one control plane and two
workers (127.0.65.1-3) with the lab's real etcd, kube-apiserver and kwok kubelets behind them.

What the operator sees is asserted: exit code 0 and the lines that matter. `reboot` and `upgrade`
wait as talosctl waits (the machine event stream until the MachineStatus is running and ready,
then a new boot id); `upgrade` drains the Node through the lab's apiserver first and uncordons it
after; `rotate-ca` and `upgrade-k8s` run their dry runs. A missing talosctl fails: run `make tools`.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec
from lab.cluster_manager import ClusterManager
from lab.process import wait_until
from lab.talos_node import Lab

CP, W1, W2 = "127.0.65.1", "127.0.65.2", "127.0.65.3"
T = 10  # seconds per Kubernetes request
NEXT_TALOS = "v1.13.1"
# talosctl's tracker reconnects 1 s after a reboot sequence starts, asking for new events only: a
# machine already back by then is missed (a real one is down far longer), so reboots take 2 s here.
REBOOT = 2.0
LABELS = {"app.kubernetes.io/part-of": "cilium", "k8s-app": "cilium"}
CNI_AGENT = {  # Nodes turn Ready once a Cilium agent pod runs on them (lab/kwok): a stand-in DaemonSet
    "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "cilium", "labels": LABELS},
    "spec": {"selector": {"matchLabels": LABELS}, "template": {"metadata": {"labels": LABELS}, "spec": {
        "hostNetwork": True, "automountServiceAccountToken": False, "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "agent", "image": "quay.io/cilium/cilium:v1.18.4"}]}}}}
WORKLOAD = {  # something for a drain to evict
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
    "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {
        "metadata": {"labels": {"app": "web"}},
        "spec": {"tolerations": [{"operator": "Exists"}], "containers": [{"name": "web", "image": "nginx"}]}}}}


@pytest.fixture(scope="module")
def talosctl(tools_bin: Path) -> Path:
    missing = [t for t in ("talosctl", "etcd", "kube-apiserver", "kwok") if not (tools_bin / t).exists()]
    if missing:
        pytest.fail(f"pinned tools missing from {tools_bin}: {', '.join(missing)}; run `make tools`")
    return tools_bin / "talosctl"


def ready(core: client.CoreV1Api) -> dict[str, bool]:
    return {n.metadata.name: any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            for n in core.list_node(_request_timeout=T).items}


@pytest.fixture(scope="module")
def zone(talosctl, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("talosctl")
    bundle = secrets.generate()
    spec = ClusterSpec(name="talosctl", endpoint=f"https://{CP}:6443", kubernetes_version="1.35.4",
                       workers=(PoolSpec("web", 2),))
    with Lab(pool="127.0.65.0/29", reboot_delay=REBOOT) as lab, \
            ClusterManager(lab.clusters, tmp / "clusters", standins=False, runner_poll=0.5):
        for address, pool in ((CP, "controlplane"), (W1, "web"), (W2, "web")):
            lab.add_node(address)
            TalosClient.maintenance(address).apply_config(mc.render(spec, bundle, pool=pool))
        for address in (CP, W1, W2):
            lab.node(address).wait_for("configured", 10)
        admin = talosconfig.render("talosctl", [CP], [CP], bundle.os.crt, talosconfig.issue_client_cert(bundle.os))
        reader = talosconfig.render("talosctl", [CP], [CP], bundle.os.crt,
                                    talosconfig.issue_client_cert(bundle.os, role="os:reader"))
        (tmp / "talosconfig").write_text(admin)
        (tmp / "talosconfig-reader").write_text(reader)
        cp = TalosClient.from_talosconfig(talosconfig.parse(admin))
        cp.bootstrap()
        api = kconfig.new_client_from_config_dict(yaml.safe_load(cp.kubeconfig()))
        core = client.CoreV1Api(api)
        wait_until("the apiserver to take the DaemonSet", lambda: client.AppsV1Api(api).create_namespaced_daemon_set(
            "kube-system", CNI_AGENT, _request_timeout=T), 120)
        wait_until("three Nodes Ready", lambda: list(ready(core).values()) == [True] * 3, 120)
        client.AppsV1Api(api).create_namespaced_deployment("default", WORKLOAD, _request_timeout=T)
        yield SimpleNamespace(lab=lab, tmp=tmp, core=core, talosctl=talosctl)
        api.close()


def talosctl_run(zone, *args: str, config: str = "talosconfig", timeout: float = 120) -> subprocess.CompletedProcess:
    """talosctl as an operator runs it (no terminal: its progress goes to stderr line by line)."""
    out = subprocess.run([str(zone.talosctl), "--talosconfig", str(zone.tmp / config), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=zone.tmp)
    return out


def ok(zone, *args: str, **kw) -> str:
    out = talosctl_run(zone, *args, **kw)
    assert out.returncode == 0, (f"talosctl {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}\n"
                                 f"{lab_view(zone, args[1] if args[:1] == ('-n',) else CP)}")
    return out.stdout + out.stderr


def lab_view(zone, address: str) -> str:
    """What the lab shows of a machine when talosctl gave up on it: its MachineStatus, its Node's
    conditions, annotations and Lease, and the pods on it (a failed wait names its cause)."""
    node = zone.lab.node(address)
    lines = [f"lab view of {address}: mode={node.mode} boot={node.boot_id} node_ready={node.node_ready}"]
    try:
        k8s = zone.core.read_node(node.hostname, _request_timeout=T)
        lines.append(f"Node annotations: {k8s.metadata.annotations}")
        lines.append(f"Node bootID: {k8s.status.node_info.boot_id if k8s.status.node_info else None}")
        lines += [f"  {c.type}={c.status} {c.reason}: {c.message}" for c in k8s.status.conditions or []]
        lease = client.CoordinationV1Api(zone.core.api_client).read_namespaced_lease(
            node.hostname, "kube-node-lease", _request_timeout=T)
        lines.append(f"Lease holder={lease.spec.holder_identity} renewed={lease.spec.renew_time}")
        pods = zone.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node.hostname}",
                                                     _request_timeout=T).items
        lines += [f"  pod {p.metadata.namespace}/{p.metadata.name} {p.status.phase} "
                  f"{[(c.type, c.status) for c in p.status.conditions or []]}" for p in pods]
    except Exception as e:  # noqa: BLE001 - a diagnostic must not hide the failure it explains
        lines.append(f"(reading the apiserver failed: {e!r})")
    return "\n".join(lines)


def test_version_services_and_health(zone):
    assert "Tag:         v1.13.0" in ok(zone, "-n", CP, "version").split("Server:")[1]
    services = ok(zone, "-n", CP, "service")
    for line in ("etcd", "kubelet", "apid", "trustd"):
        assert any(row.split()[1:4] == [line, "Running", "OK"] for row in services.splitlines()[1:]), services
    health = ok(zone, "-n", CP, "health", "--wait-timeout", "2m", timeout=150)
    assert "waiting for etcd to be healthy: OK" in health or "OK" in health


def test_etcd_members_status_alarms_and_snapshot(zone):
    members = ok(zone, "-n", CP, "etcd", "members").splitlines()
    assert members[0].split()[:3] == ["NODE", "ID", "HOSTNAME"] and len(members) == 2
    member_id, hostname = members[1].split()[1:3]
    assert hostname == zone.lab.node(CP).hostname
    status = ok(zone, "-n", CP, "etcd", "status").splitlines()
    assert status[0].split()[:3] == ["NODE", "MEMBER", "DB"] and status[1].split()[1] == member_id
    assert member_id in status[1].split()[5:] and "3.6.9" in status[1]  # it leads; etcd's protocol version
    assert ok(zone, "-n", CP, "etcd", "alarm", "list").strip() == ""  # no alarms, no table
    snapshot = zone.tmp / "etcd.snapshot"
    assert "snapshot saved" in ok(zone, "-n", CP, "etcd", "snapshot", str(snapshot))
    assert snapshot.stat().st_size > 0
    refused = talosctl_run(zone, "-n", W1, "etcd", "status")
    assert refused.returncode != 0 and "only available on control plane nodes" in refused.stderr


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()[1:] if line.strip()]


def test_get_reads_the_day2_resources(zone):
    status = table(ok(zone, "-n", W1, "get", "machinestatus"))
    assert status[0][3] == "machine" and "running" in status[0] and "true" in status[0], \
        f"{status}\n{ok(zone, '-n', W1, 'get', 'machinestatus', '-o', 'yaml')}\n{lab_view(zone, W1)}"
    members = {row[3]: row for row in table(ok(zone, "-n", W1, "get", "members"))}
    assert sorted(members) == sorted(zone.lab.node(a).hostname for a in (CP, W1, W2))
    assert "controlplane" in members[zone.lab.node(CP).hostname] and "worker" in members[zone.lab.node(W2).hostname]
    assert f'["{W2}"]' in " ".join(members[zone.lab.node(W2).hostname])
    assert f"nodename: {zone.lab.node(W1).hostname}" in ok(zone, "-n", W1, "get", "nodename", "-o", "yaml")
    pods = table(ok(zone, "-n", CP, "get", "staticpodstatus"))
    assert sorted(row[3] for row in pods) == [f"kube-system/{c}-{zone.lab.node(CP).hostname}"
                                             for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")]
    assert all(row[-1] == "True" for row in pods)
    assert "issuingCA" in ok(zone, "-n", CP, "get", "osrootsecret", "-o", "yaml")
    refused = talosctl_run(zone, "-n", CP, "get", "osrootsecret", config="talosconfig-reader")
    assert refused.returncode != 0 and "not authorized" in refused.stderr


def test_get_kubeletspec(zone):
    spec = ok(zone, "-n", W1, "get", "kubeletspec", "-o", "yaml")
    assert f"--hostname-override={zone.lab.node(W1).hostname}" in spec


def test_logs_and_dmesg(zone):
    assert "serving client traffic securely" in ok(zone, "-n", CP, "logs", "etcd")
    assert "Started kubelet" in ok(zone, "-n", W1, "logs", "kubelet")
    assert "Linux version" in ok(zone, "-n", W1, "dmesg")


def test_reboot_returns_once_the_node_is_running_and_ready_with_a_new_boot_id(zone):
    node = zone.lab.node(W1)
    boots, boot_id = node.boots, node.boot_id
    out = ok(zone, "-n", W1, "reboot", "--timeout", "2m", timeout=150)
    assert node.boots == boots + 1 and node.boot_id != boot_id and node.mode == "configured"
    assert "events check condition met" in out and "post check passed" in out, out


def test_upgrade_without_drain_installs_reboots_and_waits(zone):
    node = zone.lab.node(W1)
    boots = node.boots
    out = ok(zone, "-n", W1, "upgrade", "--image", f"ghcr.io/siderolabs/installer:{NEXT_TALOS}", "--drain=false",
             "--timeout", "2m", timeout=150)
    assert node.talos_version == NEXT_TALOS and node.boots == boots + 1
    assert "upgrade completed" in out and "post check passed" in out, out
    assert f"Tag:         {NEXT_TALOS}" in ok(zone, "-n", W1, "version").split("Server:")[1]


def test_upgrade_drains_the_node_and_uncordons_it_once_ready(zone):
    node, name = zone.lab.node(W2), zone.lab.node(W2).hostname
    start = time.time()
    out = ok(zone, "-n", W2, "upgrade", "--image", f"ghcr.io/siderolabs/installer:{NEXT_TALOS}",
             "--timeout", "2m", "--drain-timeout", "1m", timeout=200)
    assert node.talos_version == NEXT_TALOS
    assert "cordon" in out.lower() and "post check passed" in out, out
    assert not zone.core.read_node(name, _request_timeout=T).spec.unschedulable
    log = [e["event"] for e in node.event_log() if e["time"] >= start]
    assert log.index("installed") < log.index("reboot") < log.index("booted"), log


def test_rotate_ca_dry_runs_complete_their_checks(zone):
    """The Talos API CA's dry run reads the topology from the discovery Members and the CA from
    OSRootSecrets, then prints every phase; talosctl v1.13.0 itself then exits 1 ("failed to
    determine endpoints": it builds a client from the talosconfig a dry run never made,
    siderolabs/talos#14108), as it does against Talos. The Kubernetes CA's dry run passes."""
    talos = talosctl_run(zone, "-n", CP, "rotate-ca", "--kubernetes=false", "--output", str(zone.tmp / "new"))
    out = talos.stdout
    assert f'control plane nodes: ["{CP}"]' in out and f'worker nodes: ["{W1}" "{W2}"]' in out, out
    assert "> Current Talos CA:" in out and "> Verifying connectivity with new PKI:" in out
    assert "no changes were made to the cluster" in out and not (zone.tmp / "new").exists()
    assert talos.returncode == 1 and talos.stderr.strip() == \
        "failed to create new client with rotated Talos CA: failed to determine endpoints", talos.stderr

    k8s = ok(zone, "-n", CP, "rotate-ca", "--talos=false")
    assert "> Starting Kubernetes API PKI rotation, dry-run mode true" in k8s and "> Current Kubernetes CA:" in k8s
    assert f'worker nodes: ["{W1}" "{W2}"]' in k8s and "no changes were made to the cluster" in k8s, k8s


def test_upgrade_k8s_dry_run_runs_its_checks(zone):
    out = ok(zone, "-n", CP, "upgrade-k8s", "--to", "1.35.5", "--dry-run", timeout=150)
    assert f'discovered controlplane nodes ["{CP}"]' in out and f'discovered worker nodes ["{W1}" "{W2}"]' in out, out
    for step in ('updating "kube-apiserver" to version "1.35.5"', "updating kubelet to version", "skipped in dry-run"):
        assert step in out, out
