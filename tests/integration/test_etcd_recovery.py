"""etcd backup and disaster recovery against a REAL etcd: an emulated 3-control-plane cluster
whose lab control plane (etcd + kube-apiserver, kwok) answers the Talos API's EtcdSnapshot with
etcd's own snapshot and restores it with etcdutl on Bootstrap(recover_etcd).

ConfigMap A, backup, ConfigMap B, etcd lost (two control planes wiped: no quorum), restore:
A is back, B is gone, the cluster passes Talos's health check again. Bad files and bad zones
are refused before anything is wiped. Addresses 127.0.42.8/29 are this module's own."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum.backup import credential, files, sealed
from kontinuum.backup.restore import Bounds, restore, verify
from kontinuum.backup.take import take
from kontinuum.backup.zone import BackupError, ZoneAccess
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec
from lab.cluster_manager import ClusterManager
from lab.process import wait_until
from lab.talos_node import Lab

T = 10  # seconds per API call
CPS = ["127.0.42.11", "127.0.42.12", "127.0.42.13"]
NOBODY = "127.0.42.14"  # nothing listens here
CLUSTER = "e2e-dr"
BOUNDS = Bounds(wipe=60, health=120, upload=60)


@pytest.fixture(scope="module")
def tools(tools_bin: Path) -> Path:
    missing = [t for t in ("etcd", "etcdutl", "kube-apiserver", "kwok") if not (tools_bin / t).exists()]
    if missing:
        pytest.fail(f"pinned tools missing from {tools_bin}: {', '.join(missing)}; run `make tools`")
    return tools_bin


def admin(bundle: secrets.SecretsBundle) -> str:
    return talosconfig.render(CLUSTER, CPS, [], bundle.os.crt, talosconfig.issue_client_cert(bundle.os))


def cni_daemonset() -> dict:
    """Stands for Cilium's agent: kwok runs it Ready on every node, so the Nodes turn Ready. Like
    Kontinuum's Cilium it reaches the apiserver through KubePrism, not the Service network, which
    the lab's pod network serves only once a node's CNI is ready (lab/pod_network.py)."""
    labels = {"app.kubernetes.io/part-of": "cilium", "k8s-app": "cilium"}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "cilium", "labels": labels},
            "spec": {"selector": {"matchLabels": {"k8s-app": "cilium"}},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"tolerations": [{"operator": "Exists"}], "hostNetwork": True,
                                           "containers": [{"name": "agent", "image": "quay.io/cilium/cilium:lab",
                                                  "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "localhost"},
                                                          {"name": "KUBERNETES_SERVICE_PORT", "value": "7445"}]}]}}}}


@pytest.fixture(scope="module")
def zone(tools, tmp_path_factory):
    bundle = secrets.generate()
    spec = ClusterSpec(name=CLUSTER, endpoint=f"https://{CPS[0]}:6443", kubernetes_version="1.35.4",
                       control_plane=PoolSpec(CONTROLPLANE, 3))
    work = tmp_path_factory.mktemp("dr")
    with Lab(pool="127.0.42.8/29", reboot_delay=0.5) as lab, \
            ClusterManager(lab.clusters, work / "clusters", standins=False) as mgr:
        for a in CPS:
            lab.add_node(a)
        config = mc.render(spec, bundle)
        for a in CPS:
            TalosClient.maintenance(a).apply_config(config)
        for a in CPS:
            lab.node(a).wait_for("configured", 10)
        access = ZoneAccess(cluster=CLUSTER, talosconfig=admin(bundle), secrets_yaml=secrets.dump(bundle),
                            control_planes=tuple(CPS), key=sealed.new_key(),
                            backup_talosconfig=credential.issue(CLUSTER, secrets.dump(bundle), CPS))
        access.client(CPS[0]).bootstrap()
        kubeconfig = wait_until("the kubeconfig", lambda: access.client(CPS[1]).kubeconfig(), 60)
        api = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))
        core = client.CoreV1Api(api)
        wait_until("the apiserver", lambda: core.list_namespace(_request_timeout=T).items, 120)
        client.AppsV1Api(api).create_namespaced_daemon_set("kube-system", cni_daemonset(), _request_timeout=T)
        access.client(CPS[0]).health_check(CPS, wait_timeout=120)
        yield lab, mgr, access, core, work
        api.close()


def configmap(core: client.CoreV1Api, name: str) -> None:
    core.create_namespaced_config_map("default", {"metadata": {"name": name}, "data": {"k": name}}, _request_timeout=T)


def configmaps(core: client.CoreV1Api) -> set[str]:
    return {c.metadata.name for c in core.list_namespaced_config_map("default", _request_timeout=T).items
            if c.metadata.name.startswith("dr-")}


def resets(lab: Lab) -> int:
    return sum(lab.node(a).calls.get("Reset", 0) for a in CPS)


def test_backup_wipe_restore_brings_back_the_snapshot(zone):
    lab, mgr, access, core, work = zone
    configmap(core, "dr-a")
    folder = files.zone_directory(work / "backups", "eu", CLUSTER)
    for i in range(3):  # keep=2: the oldest goes
        taken = take(access, folder, keep=2, now=dt.datetime(2026, 12, 1, 6, 0, i, tzinfo=dt.timezone.utc))
    path = Path(taken.path)  # a folder destination: the file itself
    assert path.name.startswith(f"{CLUSTER}-") and path.name.endswith(".etcd.sealed")
    assert taken.size % 512 == 32 and path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in files.backups(folder, CLUSTER)] == [f"{CLUSTER}-20261201T060001Z.etcd.sealed",
                                                                  f"{CLUSTER}-20261201T060002Z.etcd.sealed"]
    assert not list(folder.glob("*.part"))
    assert b"dr-a" not in path.read_bytes()  # sealed: no plaintext key names on disk
    configmap(core, "dr-b")
    assert configmaps(core) == {"dr-a", "dr-b"}

    with pytest.raises(BackupError, match=r"etcd is healthy on .*--force"):
        restore(access, path, bounds=BOUNDS, log=lambda m: None)
    assert resets(lab) == 0

    # The disaster: two of three control planes lose their etcd data, so etcd loses its quorum.
    boots = {a: lab.node(a).boots for a in CPS[:2]}
    for a in CPS[:2]:
        access.client(a).reset(graceful=False, reboot=True, system_partitions=["EPHEMERAL"])
    for a in CPS[:2]:
        lab.node(a).wait_for("configured", 10, after_boot=boots[a])
    wait_until("the lab's control plane to stop with etcd's quorum", lambda: not mgr.runners, 60)

    said: list[str] = []

    def log(message: str) -> None:  # the first control plane refuses connections as its upload starts
        said.append(message)
        if "uploading the snapshot" in message:
            lab.node(CPS[0]).set_faults(refuse=True)
            threading.Timer(1.5, lambda: lab.node(CPS[0]).set_faults(refuse=False)).start()

    restore(access, path, bounds=BOUNDS, log=log)
    assert any(f"{CPS[0]} does not take the upload yet" in m for m in said), said
    plan = said[0]
    assert "1. wipe etcd data" in plan and f"of: {CPS[2]} (already wiped: {CPS[0]}, {CPS[1]})" in plan, plan
    assert lab.node(CPS[2]).calls.get("Reset") == 1 and resets(lab) == 3  # the two of the disaster + one
    assert lab.node(CPS[0]).calls.get("EtcdRecover") == 1

    api = kconfig.new_client_from_config_dict(yaml.safe_load(access.client(CPS[0]).kubeconfig()))
    restored = client.CoreV1Api(api)
    assert configmaps(restored) == {"dr-a"}  # A is back, B (written after the snapshot) is gone
    members = access.client(CPS[1]).etcd_members()
    assert sorted(m.hostname for m in members) == sorted(lab.node(a).hostname for a in CPS)
    access.client(CPS[0]).health_check(CPS, wait_timeout=30)
    api.close()

    # Run again: the restore finished, so etcd is healthy and a second run refuses.
    with pytest.raises(BackupError, match="healthy"):
        restore(access, path, bounds=BOUNDS, log=lambda m: None)


def test_bad_files_and_bad_zones_are_refused_before_anything_is_wiped(zone, tmp_path):
    lab, _, access, _, work = zone
    good = files.backups(files.zone_directory(work / "backups", "eu", CLUSTER), CLUSTER)[-1]
    before = resets(lab)
    data = good.read_bytes()

    def refused(path: Path, match: str, who: ZoneAccess = access) -> None:
        with pytest.raises(BackupError, match=match):
            restore(who, path, force=True, bounds=BOUNDS, log=lambda m: None)

    (tmp_path / "truncated").write_bytes(data[: len(data) // 2])
    refused(tmp_path / "truncated", "truncated.*nothing was changed")
    corrupted = bytearray(data)
    corrupted[len(data) // 2] ^= 0x01
    (tmp_path / "corrupted").write_bytes(bytes(corrupted))
    refused(tmp_path / "corrupted", "fails authentication: the file is corrupted")
    (tmp_path / "not-ours").write_bytes(b"\0" * 4096)
    refused(tmp_path / "not-ours", "not a Kontinuum etcd backup")

    other = ZoneAccess(cluster=CLUSTER, talosconfig=access.talosconfig, key=access.key,
                       secrets_yaml=secrets.dump(secrets.generate()), control_planes=access.control_planes)
    refused(good, "of another cluster named e2e-dr .*nothing was changed", other)
    other_zone = ZoneAccess(cluster="e2e-other", talosconfig=access.talosconfig, key=access.key,
                            secrets_yaml=access.secrets_yaml, control_planes=access.control_planes)
    refused(good, "backup of zone e2e-dr, not of e2e-other", other_zone)
    rekeyed = ZoneAccess(cluster=CLUSTER, talosconfig=access.talosconfig, key=sealed.new_key(),
                         secrets_yaml=access.secrets_yaml, control_planes=access.control_planes)
    refused(good, "sealed with another backup key", rekeyed)
    keyless = ZoneAccess(cluster=CLUSTER, talosconfig=access.talosconfig, secrets_yaml=access.secrets_yaml,
                         control_planes=access.control_planes)
    refused(good, f"zone {CLUSTER}: the stack holds no backup key", keyless)
    gone = ZoneAccess(cluster=CLUSTER, talosconfig=access.talosconfig, key=access.key,
                      secrets_yaml=access.secrets_yaml, control_planes=(NOBODY,))
    refused(good, rf"(?s)zone {CLUSTER}: no control plane answers.*nothing was wiped.*{NOBODY}: service-list", gone)
    assert verify(good, access).size % 512 == 32
    said: list[str] = []
    restore(access, good, dry_run=True, log=said.append)  # checks everything, prints the plan, does nothing
    assert "1. wipe etcd data" in said[0] and "needs --force" in said[0], said
    assert resets(lab) == before and sum(lab.node(a).calls.get("EtcdRecover", 0) for a in CPS) == 1


def test_renewed_credentials_work_against_the_real_apiserver_and_nodes(zone):
    """What a renewal issues locally (kontinuum/talos/renewal.py) is accepted by the zone: the
    kubeconfig by its real kube-apiserver, the talosconfig by its (emulated) apid."""
    from kontinuum.talos import renewal

    _, _, access, _, _ = zone
    bundle = secrets.load(access.secrets_yaml, check_rsa=False)
    held = access.client(CPS[0]).kubeconfig()
    renewed = renewal.renew_kubeconfig(held, bundle.k8s)
    assert renewal.kubeconfig_cert(renewed) != renewal.kubeconfig_cert(held)
    api = kconfig.new_client_from_config_dict(yaml.safe_load(renewed))
    assert client.CoreV1Api(api).list_namespace(_request_timeout=T).items
    api.close()
    client_cert = renewal.renew_talosconfig_cert(bundle.os)
    fresh = talosconfig.render(CLUSTER, CPS, [], bundle.os.crt, client_cert)
    assert TalosClient.from_talosconfig(talosconfig.parse(fresh), node=CPS[1], endpoint=CPS[1]).version().tag


def test_an_expired_talosconfig_is_refused_and_the_cli_renews_before_use(zone):
    """A talosconfig that expired between two runs: the node refuses it; backup/restore (ZoneAccess)
    use a certificate issued from the bundle instead, for that run only."""
    import datetime as dt

    from kontinuum.talos import pki
    from kontinuum.talos.errors import TalosError

    _, _, access, _, _ = zone
    bundle = secrets.load(access.secrets_yaml, check_rsa=False)
    expired = pki.issue_cert(bundle.os, organizations=["os:admin"], client=True, key_type="ed25519", days=1,
                             now=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=5))
    held = talosconfig.render(CLUSTER, CPS, [], bundle.os.crt, expired)
    with pytest.raises(TalosError):
        TalosClient.from_talosconfig(talosconfig.parse(held), node=CPS[0], endpoint=CPS[0]).version(timeout=5)
    stale = ZoneAccess(cluster=CLUSTER, talosconfig=held, secrets_yaml=access.secrets_yaml, control_planes=(CPS[0],))
    assert stale.client(CPS[0]).version().tag
