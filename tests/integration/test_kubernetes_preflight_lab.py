"""The Kubernetes upgrade's pre-flight against emulated Talos nodes over real mTLS: the nodes serve
their StaticPods and KubeletSpec (COSI, namespace k8s) built from their configs, with
`talos.dev/config-version`; a control plane that still runs a flag the target removes refuses the
upgrade before any node changes, naming node, component and flag, even when our new config no
longer sets it. Addresses 127.0.62.8-15 are this module's own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kontinuum.lifecycle import image_patch
from kontinuum.lifecycle import kubernetes_preflight as pf
from kontinuum.lifecycle import kubernetes_upgrade as ku
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.client import TalosClient
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec
from lab.talos_node import Lab

CP, WORKER = "127.0.62.9", "127.0.62.10"
OLD, NEW = "1.32.4", "1.33.0"
FLAG = {"cluster": {"apiServer": {"extraArgs": {"cloud-config": "/etc/kubernetes/cloud.conf"}}}}


def render(version: str, bundle, pool: str = "controlplane", patches=()) -> str:
    spec = ClusterSpec(name="lab-preflight", endpoint=f"https://{CP}:6443", kubernetes_version=version,
                       workers=(PoolSpec("web", 1),), patches=tuple(patches))
    return mc.render(spec, bundle, pool=pool).decode()


def talos(bundle, address: str) -> TalosClient:
    cert = talosconfig.issue_client_cert(bundle.os)
    return TalosClient.from_talosconfig(talosconfig.parse(talosconfig.render("lab", [address], [address], bundle.os.crt, cert)))


@pytest.fixture(scope="module")
def zone():
    bundle = secrets.generate()
    with Lab(pool="127.0.62.8/29", reboot_delay=0.1) as lab:
        for a in (CP, WORKER):
            lab.add_node(a)
        TalosClient.maintenance(CP).apply_config(render(OLD, bundle, patches=[FLAG]))
        TalosClient.maintenance(WORKER).apply_config(render(OLD, bundle, pool="web"))
        for a in (CP, WORKER):
            lab.node(a).wait_for("configured", 10)
        yield SimpleNamespace(lab=lab, bundle=bundle, clients={a: talos(bundle, a) for a in (CP, WORKER)})


def test_the_nodes_serve_what_they_run_as_talos_does(zone):
    pod = zone.clients[CP].resource("k8s", pf.STATIC_POD, "kube-apiserver")
    container = pod["spec"]["containers"][0]
    assert container["image"] == f"registry.k8s.io/kube-apiserver:v{OLD}"
    assert "--cloud-config=/etc/kubernetes/cloud.conf" in container["command"]
    assert int(pod["metadata"]["annotations"]["talos.dev/config-version"]) >= 1
    assert zone.clients[WORKER].resource("k8s", pf.STATIC_POD, "kube-apiserver") is None  # a worker runs none
    kubelet = zone.clients[WORKER].resource("k8s", pf.KUBELET_SPEC, "kubelet")
    assert kubelet["image"] == f"ghcr.io/siderolabs/kubelet:v{OLD}" and "--config=/etc/kubernetes/kubelet.yaml" in kubelet["args"]


def test_a_removed_flag_the_control_plane_runs_refuses_the_upgrade_before_any_node_changes(zone):
    before = {a: dict(zone.lab.node(a).calls) for a in (CP, WORKER)}
    # The new config no longer sets it, but the node still runs it: talosctl refuses, so do we.
    nodes = [ku.Node("cp", CP, True, render(NEW, zone.bundle), "controlplane"),
             ku.Node("w", WORKER, False, render(NEW, zone.bundle, pool="web"), "web")]
    ctx = ku.Context(client_for=zone.clients.__getitem__, core=SimpleNamespace(), log=lambda m: None, timeout=10)
    with pytest.raises(pf.PreflightError) as err:
        ku.rollout(ctx, ku.plan(nodes), f"v{NEW}", current=f"v{OLD}")
    text = str(err.value)
    assert "refused before any node changed" in text
    assert f"cp ({CP}): kube-apiserver flag cloud-config is removed in v{NEW}; it still runs with it" in text
    assert "apply a config without it at the current version first" in text
    after = {a: dict(zone.lab.node(a).calls) for a in (CP, WORKER)}
    for a in (CP, WORKER):
        assert after[a].get("ApplyConfiguration", 0) == before[a].get("ApplyConfiguration", 0)
        assert after[a].get("ImagePull", 0) == before[a].get("ImagePull", 0)
    # A step that removes nothing the nodes run passes (1.33 → 1.34 removes the kubelet's cloud-config).
    pf.check_zone(f"v{NEW}", "v1.34.0", [pf.Member(n.name, n.address, n.control_plane, n.pool, n.config) for n in nodes],
                  zone.clients.__getitem__, None)


def test_config_version_follows_the_components_config_on_the_node(zone):
    client = zone.clients[CP]
    before = client.resource("k8s", pf.STATIC_POD, "kube-scheduler")["metadata"]["annotations"]["talos.dev/config-version"]
    api = client.resource("k8s", pf.STATIC_POD, "kube-apiserver")["metadata"]["annotations"]["talos.dev/config-version"]
    live = client.machine_config()
    client.apply_config(image_patch.with_image(live, "kube-scheduler", f"registry.k8s.io/kube-scheduler:v{NEW}"),
                        mode="no-reboot")
    after = client.resource("k8s", pf.STATIC_POD, "kube-scheduler")
    assert int(after["metadata"]["annotations"]["talos.dev/config-version"]) == int(before) + 1
    assert after["spec"]["containers"][0]["image"] == f"registry.k8s.io/kube-scheduler:v{NEW}"
    # another component's config did not change: neither did its version
    assert client.resource("k8s", pf.STATIC_POD, "kube-apiserver")["metadata"]["annotations"]["talos.dev/config-version"] == api
