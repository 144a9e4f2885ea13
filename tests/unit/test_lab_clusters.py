"""The lab's cluster manager, pure parts: what it reads from a machine config, the Node it
registers, and the Talos-named health checks it derives from apiserver objects."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import pki, secrets
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec
from lab import cluster_config, cluster_health, kubelets, kwok


@pytest.fixture(scope="module")
def bundle():
    return secrets.generate()


def spec(**kw) -> ClusterSpec:
    return ClusterSpec(name="zone-a", endpoint="https://127.0.30.1:6443", kubernetes_version="1.34.1", **kw)


def test_reads_the_control_plane_pki_and_networks_from_the_machine_config(bundle):
    cfg = cluster_config.read_cluster_config(mc.render(spec(), bundle))
    assert (cfg.name, cfg.endpoint_host, cfg.endpoint_port) == ("zone-a", "127.0.30.1", 6443)
    assert cfg.pki.ca.crt == bundle.k8s.crt and cfg.pki.etcd_ca.crt == bundle.etcd.crt
    assert cfg.pki.aggregator_ca.crt == bundle.k8s_aggregator.crt
    pki.load_private_key(cfg.pki.service_account_key)  # Talos key labels load
    assert (cfg.pod_subnet, cfg.service_subnet) == ("10.244.0.0/16", "10.96.0.0/12")
    assert cfg.allow_scheduling_on_control_planes  # no workers: Talos lets pods onto control planes
    with_workers = cluster_config.read_cluster_config(mc.render(spec(workers=(PoolSpec("w", 1),)), bundle))
    assert not with_workers.allow_scheduling_on_control_planes


def test_a_worker_config_has_no_control_plane_keys(bundle):
    with pytest.raises(ValueError, match="cluster.ca.key"):
        cluster_config.read_cluster_config(mc.render(spec(workers=(PoolSpec("w", 1),)), bundle, pool="w"))


def test_pod_cidrs_are_distinct_slices_of_the_pod_subnet():
    assert kubelets.pod_cidr("10.244.0.0/16", []) == "10.244.0.0/24"
    assert kubelets.pod_cidr("10.244.0.0/16", ["10.244.0.0/24"]) == "10.244.1.0/24"
    assert kubelets.pod_cidr("10.9.8.0/26", []) == "10.9.8.0/26"


def test_node_manifest_is_what_a_talos_kubelet_registers():
    cp = cluster_config.MemberInfo("cp-1", "127.0.30.1", True, {"zone": "a"}, "v1.34.1", "v1.13.0")
    node = kubelets.node_manifest(cp, cluster="zone-a", cidr="10.244.0.0/24", allow_scheduling_on_control_planes=False)
    md = node["metadata"]
    assert md["labels"][kubelets.HOSTNAME_LABEL] == "cp-1" and md["labels"]["zone"] == "a"
    assert md["labels"][kubelets.CONTROL_PLANE_LABEL] == ""
    assert md["annotations"][kwok.MANAGED_ANNOTATION] == "zone-a"
    assert node["spec"]["taints"] == [{"key": kubelets.CONTROL_PLANE_LABEL, "effect": "NoSchedule"}]
    assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": "127.0.30.1"}
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.1"
    allowed = kubelets.node_manifest(cp, cluster="zone-a", cidr="10.244.0.0/24", allow_scheduling_on_control_planes=True)
    assert "taints" not in allowed["spec"]
    worker = kubelets.node_manifest(cluster_config.MemberInfo("w-1", "127.0.30.2", False), cluster="zone-a",
                                    cidr="10.244.1.0/24", allow_scheduling_on_control_planes=False)
    assert kubelets.CONTROL_PLANE_LABEL not in worker["metadata"]["labels"] and "taints" not in worker["spec"]


def _node(name: str, ip: str, ready: bool) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name),
        status=client.V1NodeStatus(
            addresses=[client.V1NodeAddress(type="InternalIP", address=ip)],
            conditions=[client.V1NodeCondition(type="Ready", status="True" if ready else "False")],
        ),
    )


def _pod(name: str, node: str | None, ready: bool, owner: str = "DaemonSet", scheduled_message: str | None = None):
    conditions = [client.V1PodCondition(type="Ready", status="True" if ready else "False")]
    if scheduled_message:
        conditions.append(client.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                                                message=scheduled_message))
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, namespace="kube-system", labels={"app.kubernetes.io/part-of": "cilium"},
                                     owner_references=[
            client.V1OwnerReference(api_version="apps/v1", kind=owner, name="x", uid="u")]),
        spec=client.V1PodSpec(containers=[], node_name=node),
        status=client.V1PodStatus(phase="Running" if node else "Pending", conditions=conditions),
    )


def test_health_checks_word_their_reasons_like_talos():
    nodes = [_node("cp-1", "127.0.30.1", True), _node("cp-2", "127.0.30.2", False)]
    assert cluster_health.nodes_report_problem(["127.0.30.2", "127.0.30.1"], nodes) is None
    assert cluster_health.nodes_report_problem(["127.0.30.1", "127.0.30.3"], nodes) == (
        'expected node internal IPs ["127.0.30.1" "127.0.30.3"] but got ["127.0.30.1" "127.0.30.2"]')
    assert cluster_health.nodes_ready_problem(nodes) == "some nodes are not ready: [cp-2]"
    assert cluster_health.nodes_ready_problem(nodes[:1]) is None


def test_cilium_check_and_cni_readiness():
    ds = [object()]
    agent = _pod("cilium-abc", "cp-1", True)
    op_ok = _pod("cilium-operator-1", "cp-1", True, owner="ReplicaSet")
    op_pending = _pod("cilium-operator-2", None, False, owner="ReplicaSet",
                      scheduled_message="0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports.")
    assert cluster_health.cilium_problem([agent, op_ok, op_pending], []) is None  # not installed: nothing to wait for
    assert cluster_health.cilium_problem([agent, op_ok], ds) is None
    problem = cluster_health.cilium_problem([agent, op_ok, op_pending], ds)
    assert problem.startswith("some pods are not ready: cilium-operator-2 (Pending: 0/1 nodes are available")
    assert "\n" not in problem
    as_json = lambda *pods: [client.ApiClient().sanitize_for_serialization(p) for p in pods]  # noqa: E731
    assert cluster_health.cni_ready_nodes(as_json(agent, op_ok, _pod("cilium-def", "cp-2", False))) == {"cp-1"}
    assert cluster_health.cni_ready_nodes(as_json(op_ok)) == set()  # the operator is no CNI agent
    other = _pod("node-exporter-x", "cp-2", True)
    other.metadata.labels = {"app": "node-exporter"}
    assert cluster_health.cni_ready_nodes(as_json(other)) == set()  # the pass hands over every pod: only Cilium's count


def test_kwok_stages_are_ours_and_well_formed():
    docs = list(yaml.safe_load_all(kwok.STAGES.read_text()))
    names = [d["metadata"]["name"] for d in docs]
    assert len(set(names)) == len(names) and all(n.startswith("lab-") for n in names)
    for d in docs:
        assert (d["apiVersion"], d["kind"]) == ("kwok.x-k8s.io/v1alpha1", "Stage")
        assert d["spec"]["resourceRef"]["kind"] in ("Node", "Pod")
        for p in d["spec"]["next"].get("patches", []):
            assert (p["subresource"], p["root"], p["type"]) == ("status", "status", "strategic")
    argv = kwok.argv("/k", cluster="zone-a", node_ip="127.0.30.1", pod_cidr="10.244.0.0/16", server="127.0.30.1:4000")
    assert f"--manage-nodes-with-annotation-selector={kwok.MANAGED_ANNOTATION}=zone-a" in argv
    assert "--server-address=127.0.30.1:4000" in argv and not any(a.startswith("--node-port") for a in argv)


def _goroutine(number: int, function: str) -> str:
    return (f"goroutine {number} [chan receive]:\nsigs.k8s.io/kwok/pkg/kwok/controllers.{function}(...)\n"
            f"\t/root/go/pkg/mod/sigs.k8s.io/kwok@v0.7.0/pkg/kwok/controllers/x.go:1 +0x1\ncreated by x in goroutine 1")


def test_the_kwok_controller_started_first_is_read_from_its_goroutine_numbers():
    """kwok v0.7.0 builds its Pod controller without a Lease check when it starts it before its Node
    controller (lab/kwok): the lab keeps only a kwok whose Node controller's goroutines are older."""
    node, pod = "(*NodeController).watchResources", "(*PodController).watchResources"
    other = _goroutine(3, "(*NodeLeaseController).syncWorker")
    assert kwok.first_controller("\n\n".join([other, _goroutine(40, node), _goroutine(52, pod)])) == "Node"
    assert kwok.first_controller("\n\n".join([_goroutine(52, node), other, _goroutine(40, pod)])) == "Pod"
    assert kwok.first_controller("\n\n".join([other, _goroutine(40, node)])) is None  # not both running yet
    assert kwok.first_controller("") is None



def test_the_kubelet_resync_touches_only_pods_kwok_left_pending_on_a_running_kubelet():
    """kwok may skip a pod for good when it takes a Node's Lease (lab/kubelet_resync.py); the lab
    touches exactly the pods a running kubelet would have started by now, and each at most once
    per grace period."""
    from lab.kubelet_resync import GRACE, SYNC_ANNOTATION, missed

    created = 1_796_074_400.0  # 2026-11-30T21:33:20Z

    def pod(name, node="w-1", phase="Pending", ip=None, **meta):
        return {"metadata": {"name": name, "namespace": "default", "creationTimestamp": "2026-11-30T21:33:20Z", **meta},
                "spec": {"nodeName": node}, "status": {"phase": phase, **({"podIP": ip} if ip else {})}}

    pods = [pod("missed"), pod("started", ip="10.244.1.2"), pod("running", phase="Running", ip="10.244.1.3"),
            pod("deleting", deletionTimestamp="2026-11-30T21:33:21Z"), pod("down", node="w-2"),
            pod("mirror", annotations={kubelets.MIRROR_ANNOTATION: "x"}),
            pod("touched", annotations={SYNC_ANNOTATION: f"{created + 20:.3f}"})]
    since = {"w-1": created + 10}  # w-1's kubelet runs since then; w-2's does not run
    names = lambda now: [p["metadata"]["name"] for p in missed(pods, since, now)]  # noqa: E731
    assert names(created + 10 + GRACE - 0.1) == []  # the kubelet just started: kwok has its grace
    assert names(created + 10 + GRACE) == ["missed"]
    assert names(created + 20 + GRACE) == ["missed", "touched"]  # touched once; still Pending a grace later


def test_a_ready_kwok_wrote_after_its_machine_went_down_is_taken_back():
    """kwok may play a Ready it queued before a crash after the lab took the Lease (lab/kubelets.py
    take_back_late_ready): the lab writes Ready False for exactly those pods, as the node lifecycle
    controller's pass would have, and leaves every other pod alone."""
    patched = []

    class Core:
        def patch_namespaced_pod_status(self, name, namespace, body, **_):
            patched.append((namespace, name, body["status"]["conditions"][0]["status"]))

    def pod(name, node, ready, since, **meta):
        return {"metadata": {"name": name, "namespace": "default", **meta}, "spec": {"nodeName": node},
                "status": {"phase": "Running", "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": since}]}}

    left = {"w-1": "2026-12-03T16:31:37Z"}
    pods = [pod("late", "w-1", True, "2026-12-03T16:31:39Z"), pod("same-second", "w-1", True, "2026-12-03T16:31:37Z"),
            pod("before", "w-1", True, "2026-12-03T16:31:20Z"), pod("not-ready", "w-1", False, "2026-12-03T16:31:40Z"),
            pod("up", "w-2", True, "2026-12-03T16:31:40Z"),
            pod("going", "w-1", True, "2026-12-03T16:31:40Z", deletionTimestamp="2026-12-03T16:31:41Z")]
    assert kubelets.take_back_late_ready(Core(), pods, left) == ["default/late", "default/same-second"]
    assert patched == [("default", "late", "False"), ("default", "same-second", "False")]
