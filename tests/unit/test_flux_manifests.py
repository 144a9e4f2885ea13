"""What Kontinuum hands to the Flux Operator: pre-CNI chart values (seed 002), the FluxInstance
with its sync and the suspendApps patch, credential Secrets in Flux's layout, the readiness
verdict naming the failing condition; and the lab's pod-network verdicts."""

from __future__ import annotations

import base64
import json


from kontinuum.kube import flux, flux_manifests
from kontinuum_components import flux as component
from lab import pod_network
from tests.unit.test_flux_config import KEY, TOKEN, stack


def test_operator_values_run_it_before_pod_networking():
    v = flux_manifests.operator_values()
    assert v["hostNetwork"] is True and v["installCRDs"] is True
    assert v["extraEnvs"] == [{"name": "KUBERNETES_SERVICE_HOST", "value": "localhost"},
                              {"name": "KUBERNETES_SERVICE_PORT", "value": "7445"}]
    keys = {(t["key"], t.get("effect")) for t in v["tolerations"]}
    assert {("node.kubernetes.io/not-ready", "NoSchedule"), ("node.kubernetes.io/not-ready", "NoExecute"),
            ("node-role.kubernetes.io/control-plane", "NoSchedule")} <= keys


def _instance(**flux_cfg):
    st, errs = stack({"source": {"url": "https://git.example.com/fleet.git"}, **flux_cfg})
    assert errs == []
    return component.instance_manifest(st.zones[0].flux)


def test_instance_carries_the_sync_and_distribution():
    m = _instance(interval="5m", distribution={"version": "2.8.x", "components": ["source-controller"]})
    assert m["metadata"] == {"name": "flux", "namespace": "flux-system",
                             "labels": {"app.kubernetes.io/managed-by": "kontinuum"}}
    assert m["spec"]["sync"] == {"kind": "GitRepository", "url": "https://git.example.com/fleet.git",
                                 "ref": "refs/heads/main", "path": "clusters/eu/eu-1a", "interval": "5m"}
    assert m["spec"]["distribution"] == {"version": "2.8.x", "registry": "ghcr.io/fluxcd"}
    assert m["spec"]["components"] == ["source-controller"] and "kustomize" not in m["spec"]


def test_suspend_apps_patches_the_sync_kustomization_to_suspend_the_named_ones():
    m = _instance(suspendApps=True, apps=["apps", "tenants"])
    [outer] = m["spec"]["kustomize"]["patches"]
    assert outer["target"] == {"group": "kustomize.toolkit.fluxcd.io", "kind": "Kustomization", "name": "flux-system"}
    [op] = json.loads(outer["patch"])
    assert op["op"] == "add" and op["path"] == "/spec/patches"
    [inner] = op["value"]
    assert inner["target"]["name"] == "^(apps|tenants)$"
    assert json.loads(inner["patch"]) == [{"op": "add", "path": "/spec/suspend", "value": True}]


def test_fallback_changes_only_the_sync_source():
    base = {"source": {"url": "https://primary.example.com/fleet.git"},
            "fallbackSource": {"url": "ssh://git@backup.example.com/fleet.git", "credential": "backup",
                               "path": "kubernetes/clusters/prod"},
            "credentials": {"backup": {"sshPrivateKey": KEY, "knownHosts": "backup.example.com ssh-ed25519 A"}}}
    a = component.instance_manifest(stack(base)[0].zones[0].flux)
    b = component.instance_manifest(stack({**base, "useFallbackSource": True})[0].zones[0].flux)
    assert {k: v for k, v in a["spec"].items() if k != "sync"} == {k: v for k, v in b["spec"].items() if k != "sync"}
    assert b["spec"]["sync"] == {"kind": "GitRepository", "url": "ssh://git@backup.example.com/fleet.git",
                                 "ref": "refs/heads/main", "path": "kubernetes/clusters/prod", "interval": "1m",
                                 "pullSecret": "backup"}


def test_credential_secrets_in_the_layout_flux_reads():
    st, _ = stack({"source": {"url": "ssh://git@h/x", "credential": "ssh"},
                   "fallbackSource": {"url": "oci://registry.example.com/org/fleet", "credential": "oci"},
                   "credentials": {"ssh": {"sshPrivateKey": KEY, "knownHosts": "h ssh-ed25519 A"},
                                   "oci": {"token": TOKEN, "username": "bot"}, "https": {"token": TOKEN}}})
    by_name = {m["metadata"]["name"]: m for m in component.credential_manifests(st.zones[0].flux)}
    assert by_name["ssh"]["stringData"] == {"identity": KEY, "known_hosts": "h ssh-ed25519 A"}
    assert by_name["https"]["stringData"] == {"username": "git", "password": TOKEN}
    oci = by_name["oci"]
    assert oci["type"] == "kubernetes.io/dockerconfigjson"
    auth = json.loads(oci["stringData"][".dockerconfigjson"])["auths"]["registry.example.com"]
    assert base64.b64decode(auth["auth"]).decode() == f"bot:{TOKEN}"
    assert all(m["metadata"]["namespace"] == "flux-system" for m in by_name.values())


def test_release_points_at_the_upstream_oci_chart_or_a_local_one(tmp_path):
    st, _ = stack({"source": {"url": "https://h/x"}})
    args = component.release_args(st.zones[0].flux)
    assert args["chart"] == "oci://ghcr.io/controlplaneio-fluxcd/charts/flux-operator"
    assert args["namespace"] == "flux-system" and args["create_namespace"] is False
    st, _ = stack({"source": {"url": "https://h/x"}, "operatorChart": {"path": str(tmp_path), "namespace": "gitops"}})
    args = component.release_args(st.zones[0].flux)
    assert args["chart"] == str(tmp_path) and args["namespace"] == "gitops" and "version" not in args


def test_readiness_names_the_failing_condition():
    assert flux.readiness(None) == (False, "FluxInstance not found")
    obj = {"metadata": {"generation": 2}, "status": {"conditions": []}}
    assert flux.readiness(obj)[1].startswith("no Ready condition yet")
    obj["status"]["conditions"] = [
        {"type": "Ready", "status": "False", "reason": "HealthCheckFailed", "message": "timeout waiting for: "
         "[Deployment/flux-system/source-controller status: 'InProgress']", "observedGeneration": 2},
        {"type": "Stalled", "status": "True", "reason": "BuildFailed", "message": "no such version"}]
    ready, why = flux.readiness(obj)
    assert not ready and why.startswith("Ready=False (HealthCheckFailed): timeout waiting for")
    assert "Stalled (BuildFailed): no such version" in why
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded",
                                    "message": "ok", "observedGeneration": 1}]
    assert flux.readiness(obj) == (False, "Ready=True (ReconciliationSucceeded): ok [for generation 1, not 2 yet]")
    obj["status"]["conditions"][0]["observedGeneration"] = 2
    # the operator writes conditions before the rest of its status: Ready alone is not done yet
    assert flux.readiness(obj) == (False, "Ready=True (ReconciliationSucceeded): ok [lastAppliedRevision not written yet]")
    obj["status"]["lastAppliedRevision"] = "v2.9.0@sha256:ab"
    assert flux.readiness(obj)[0] is True


def _pod(*, host_network=True, env=None, automount=None, node="n1", phase="Pending", verdict=None):
    """A pod as the API's JSON (what the lab's pod-network loop reads)."""
    spec = {"hostNetwork": host_network, "nodeName": node,
            "containers": [{"name": "c", "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}]}
    if automount is not None:
        spec["automountServiceAccountToken"] = automount
    meta = {"name": "p", "namespace": "ns", **({"annotations": {pod_network.VERDICT: verdict}} if verdict else {})}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_pod_network_verdicts():
    prism = {"KUBERNETES_SERVICE_HOST": "localhost", "KUBERNETES_SERVICE_PORT": "7445"}
    assert pod_network.uses_service_ip(_pod())
    assert not pod_network.uses_service_ip(_pod(env=prism))
    assert not pod_network.uses_service_ip(_pod(host_network=False))
    assert not pod_network.uses_service_ip(_pod(automount=False))
    assert pod_network.verdict(_pod(), cni_ready=False) == "unreachable"
    assert pod_network.verdict(_pod(verdict="unreachable"), cni_ready=False) is None
    assert pod_network.verdict(_pod(verdict="unreachable", phase="Running"), cni_ready=True) == "reachable"
    assert pod_network.verdict(_pod(verdict="unreachable", phase="Failed"), cni_ready=True) is None  # a failed Job
    assert pod_network.verdict(_pod(), cni_ready=True) == "reachable"
    assert pod_network.verdict(_pod(env=prism), cni_ready=False) is None
    assert pod_network.verdict(_pod(node=None), cni_ready=False) is None


def test_wait_names_a_host_network_operator_without_kubeprism():
    from kubernetes import client as k

    from kontinuum.kube.flux import api_address_problem

    def pod(env, host_network=True):
        return k.V1Pod(spec=k.V1PodSpec(host_network=host_network, containers=[
            k.V1Container(name="manager", env=[k.V1EnvVar(name=n, value=v) for n, v in env])]))
    svc = ("10.96.0.1", 443)
    prism = [("KUBERNETES_SERVICE_HOST", "localhost"), ("KUBERNETES_SERVICE_PORT", "7445")]
    assert api_address_problem(pod(prism), svc) is None
    assert api_address_problem(pod([], host_network=False), svc) is None
    missing = api_address_problem(pod([]), svc)
    assert "10.96.0.1:443 (injected by the kubelet, not overridden)" in missing and "KUBERNETES_SERVICE_PORT=7445" in missing
    explicit = api_address_problem(pod([("KUBERNETES_SERVICE_HOST", "10.96.0.1")]), svc)
    assert "10.96.0.1:443 (set to it)" in explicit


def test_lab_reads_whether_kube_proxy_serves_the_cluster_ip():
    import yaml

    from kontinuum.talos import machineconfig as mc
    from kontinuum.talos import secrets
    from kontinuum.talos.clusterspec import ClusterSpec
    from lab.cluster_config import read_cluster_config

    spec = ClusterSpec(name="c", endpoint="https://127.0.43.11:6443", kubernetes_version="1.35.4")
    raw = mc.render(spec, secrets.generate())
    assert read_cluster_config(raw).kube_proxy is False  # Kontinuum's configs: Cilium replaces kube-proxy
    docs = list(yaml.safe_load_all(raw))
    docs[0]["cluster"]["proxy"]["disabled"] = False
    assert read_cluster_config(yaml.safe_dump_all(docs).encode()).kube_proxy is True


def test_our_operator_values_and_the_lab_chart_use_only_the_upstream_value_names():
    """The upstream chart cannot be rendered here (no artifact reachable), so the names we set,
    and those the lab's stand-in chart reads, are checked against its documented values."""
    import yaml

    from tests.unit.test_flux_config import ROOT

    assert set(flux_manifests.operator_values()) <= flux_manifests.UPSTREAM_CHART_VALUES
    lab_values = yaml.safe_load((ROOT / "lab/charts/flux-operator/values.yaml").read_text())
    assert set(lab_values) <= flux_manifests.UPSTREAM_CHART_VALUES
    assert lab_values["hostNetwork"] is False and lab_values["installCRDs"] is True  # the upstream defaults
