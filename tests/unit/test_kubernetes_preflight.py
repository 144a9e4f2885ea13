"""The Kubernetes upgrade's pre-flight checks (kontinuum/lifecycle/kubernetes_preflight.py and the
table in kubernetes_removed.py): matching as upstream does, what our rendered configs and patches
set, what the nodes run, removed APIs with objects; the refusal names node, component and item
and says what to do; the preview refuses what it can see."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kubernetes import client

from kontinuum.lifecycle import kubernetes_preflight as pf
from kontinuum.lifecycle import kubernetes_removed as kr
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, support
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec

GATE_136 = "WatchFromStorageWithoutResourceVersion"


def test_the_table_covers_every_minor_step_the_stack_config_allows():
    low, high = (tuple(int(p) for p in v.split(".")) for v in support.KUBERNETES_BY_TALOS["1.13"])
    steps = [f"{low[0]}.{m}->{low[0]}.{m + 1}" for m in range(low[1], high[1])]
    assert steps == list(kr.REMOVED)
    assert kr.step_of("v1.35.4", "1.36.0") == "1.35->1.36"
    assert kr.removed_for("v1.35.4", "v1.35.6") is None  # the same minor: nothing to check
    assert kr.removed_for("1.32.1", "1.33.0").flags == {kr.APISERVER: ("cloud-config",)}
    assert "pod-infra-container-image" in kr.removed_for("1.34.0", "1.35.0").flags[kr.KUBELET]


def test_matching_is_upstreams_flag_key_gate_name_and_plugin_item():
    removed = kr.Removed(feature_gates=("Old",), flags={kr.APISERVER: ("cloud-config",)}, admission_plugins=("Gone",))
    args = ["/usr/local/bin/kube-apiserver", "--cloud-config=/etc/c", "--feature-gates=New=true,Old=false",
            "--enable-admission-plugins=NodeRestriction,Gone", "--cloud-config-extra=1"]
    assert pf.arg_hits(kr.APISERVER, args, removed) == [(pf.FLAG, "cloud-config"), (pf.GATE, "Old"),
                                                         (pf.PLUGIN, "Gone")]
    # a prefix of a flag is not the flag; gates are matched by name; plugins only on the apiserver
    assert pf.arg_hits(kr.APISERVER, ["--cloud-config-extra=1", "--feature-gates=OldButNot=true"], removed) == []
    assert pf.arg_hits(kr.SCHEDULER, ["--cloud-config=x", "--enable-admission-plugins=Gone"], removed) == []
    # feature gates are not checked on the kubelet (as upstream)
    assert pf.arg_hits(kr.KUBELET, ["--feature-gates=Old=true"], removed) == []


def render(patches=(), pool_patches=()) -> tuple[str, str]:
    spec = ClusterSpec(name="z", endpoint="https://127.0.62.9:6443", kubernetes_version="1.35.4",
                       patches=tuple(patches), workers=(PoolSpec("web", 1, patches=tuple(pool_patches)),))
    bundle = secrets.generate()
    return mc.render(spec, bundle).decode(), mc.render(spec, bundle, pool="web").decode()


def test_our_rendered_configs_and_patches_are_read_as_args():
    cp, web = render(
        patches=[{"cluster": {"apiServer": {"extraArgs": {"feature-gates": f"{GATE_136}=true",
                                                          "audit-log-maxage": ["30", "31"]}}}}],
        pool_patches=[{"machine": {"kubelet": {"extraArgs": {"pod-infra-container-image": "pause:3"}}}}])
    assert pf.config_args(cp)[kr.APISERVER] == [f"--feature-gates={GATE_136}=true", "--audit-log-maxage=30",
                                                "--audit-log-maxage=31"]
    assert pf.config_args(web)[kr.KUBELET] == ["--pod-infra-container-image=pause:3"]
    hits = pf.config_hits(kr.removed_for("1.35.4", "1.36.0"), {"controlplane": cp, "web": web}, {"controlplane"})
    assert hits == [pf.Hit("pool controlplane", kr.APISERVER, pf.GATE, GATE_136, "cluster.apiServer.extraArgs")]
    hits = pf.config_hits(kr.removed_for("1.34.2", "1.35.0"), {"controlplane": cp, "web": web}, {"controlplane"})
    assert hits == [pf.Hit("pool web", kr.KUBELET, pf.FLAG, "pod-infra-container-image", "machine.kubelet.extraArgs")]
    # the same patch in a worker pool's static-pod section is not run by any static pod there
    assert pf.config_hits(kr.removed_for("1.35.4", "1.36.0"), {"web": cp}, set()) == []


def test_check_configs_refuses_naming_pool_component_gate_and_what_to_do():
    cp, web = render(patches=[{"cluster": {"apiServer": {"extraArgs": {"feature-gates": f"{GATE_136}=true"}}}}])
    problem = pf.check_configs("v1.35.6", "v1.36.0", {"controlplane": cp, "web": web}, {"controlplane"})
    assert "v1.35.6 → v1.36.0 was refused before any node changed" in problem
    assert (f"pool controlplane: kube-apiserver feature gate {GATE_136} is removed in v1.36.0; our config sets it "
            "(cluster.apiServer.extraArgs, from the zone's or the pool's patches): remove it") in problem
    assert pf.check_configs("v1.35.4", "v1.35.6", {"controlplane": cp}, {"controlplane"}) is None


class FakeApi:
    """An ApiClient answering list calls: path → item count, or a status to raise."""

    def __init__(self, answers: dict[str, object]):
        self.answers, self.paths = answers, []

    def call_api(self, path, method, **kw):
        assert method == "GET" and kw["_request_timeout"] > 0
        self.paths.append(path)
        answer = self.answers.get(path, 404)
        if isinstance(answer, int) and answer >= 400:
            raise client.ApiException(status=answer, reason="Not Found")
        return {"items": [{}] * answer}


def running(specs: dict[tuple[str, str], object]):
    return lambda rtype, rid: specs.get((rtype, rid))


def test_check_reads_what_the_nodes_run_and_removed_apis_and_names_every_hit():
    apiserver = {"spec": {"containers": [{"command": ["/usr/local/bin/kube-apiserver", "--cloud-config=/x",
                                                      "--feature-gates=AppArmor=true"]}]}}
    kubelet = {"args": ["--config=/etc/kubernetes/kubelet.yaml", "--cloud-config=/y"]}
    nodes = [("cp1 (127.0.62.11)", True, running({(pf.STATIC_POD, kr.APISERVER): apiserver,
                                                  (pf.KUBELET_SPEC, kr.KUBELET): kubelet})),
             ("w1 (127.0.62.14)", False, running({(pf.KUBELET_SPEC, kr.KUBELET): kubelet}))]
    with pytest.raises(pf.PreflightError) as err:
        pf.check("v1.32.4", "v1.33.1", configs={}, control_planes=set(), nodes=nodes, api=None)
    text = str(err.value)
    assert "cp1 (127.0.62.11): kube-apiserver flag cloud-config is removed in v1.33.1; it still runs with it" in text
    assert "cp1 (127.0.62.11): kube-apiserver feature gate AppArmor is removed" in text
    assert "w1" not in text  # the kubelet's cloud-config goes only in 1.34
    with pytest.raises(pf.PreflightError) as err:
        pf.check("v1.33.4", "v1.34.0", configs={}, control_planes=set(), nodes=nodes, api=None)
    assert "w1 (127.0.62.14): kubelet flag cloud-config is removed in v1.34.0" in str(err.value)

    api = FakeApi({"/apis/resource.k8s.io/v1alpha3/podschedulingcontexts": 2})
    with pytest.raises(pf.PreflightError) as err:
        pf.check("v1.31.4", "v1.32.0", configs={}, control_planes=set(), nodes=[], api=api)
    assert "removed API podschedulingcontexts.v1alpha3.resource.k8s.io: 2 object(s) still stored" in str(err.value)
    pf.check("v1.31.4", "v1.32.0", configs={}, control_planes=set(), nodes=[], api=FakeApi({}))  # NotFound: fine
    pf.check("v1.35.4", "v1.35.9", configs={}, control_planes=set(), nodes=nodes, api=None)  # same minor


def test_an_api_that_fails_otherwise_stops_the_checks_naming_it():
    with pytest.raises(pf.PreflightError) as err:
        pf.check("v1.31.4", "v1.32.0", configs={}, control_planes=set(), nodes=[],
                 api=FakeApi({"/apis/resource.k8s.io/v1alpha3/podschedulingcontexts": 503}))
    assert "could not list the API resources v1.32.0 removes" in str(err.value)


def test_check_zone_reads_each_node_through_its_talos_client_and_names_a_node_that_does_not_answer():
    from kontinuum.talos.errors import TalosApiError

    def client_for(address):
        def resource(namespace, rtype, rid):
            assert namespace == "k8s"
            if address == "127.0.62.12":
                raise TalosApiError(address, "get", "UNAVAILABLE: connection refused")
            return {"args": ["--pod-infra-container-image=pause"]} if rtype == pf.KUBELET_SPEC else None
        return SimpleNamespace(resource=resource)

    members = [pf.Member("w1", "127.0.62.11", False, "web", "")]
    with pytest.raises(pf.PreflightError) as err:
        pf.check_zone("1.34.3", "1.35.0", members, client_for, None)
    assert "w1 (127.0.62.11): kubelet flag pod-infra-container-image is removed in 1.35.0" in str(err.value)
    with pytest.raises(pf.PreflightError) as err:
        pf.check_zone("1.34.3", "1.35.0", [pf.Member("w2", "127.0.62.12", False, "web", "")], client_for, None)
    assert "could not read KubeletSpecs.kubernetes.talos.dev kubelet of w2 (127.0.62.12)" in str(err.value)


def test_the_preview_refuses_a_removed_gate_in_a_patch(monkeypatch):
    from kontinuum.errors import ConfigError
    from providers import kubernetes_version as kv

    monkeypatch.setattr(kv, "info", lambda _m: None)
    cp, web = render(patches=[{"cluster": {"apiServer": {"extraArgs": {"feature-gates": f"{GATE_136}=true"}}}}])
    news = {"zone": "z", "version": "v1.36.0", "configPath": "zones[0]",
            "nodes": [{"name": "cp1", "address": "127.0.62.11", "role": "controlplane", "pool": "controlplane"},
                      {"name": "w1", "address": "127.0.62.14", "role": "worker", "pool": "web"}],
            "configs": {"controlplane": cp, "web": web}}
    with pytest.raises(ConfigError) as err:
        kv.diff_kubernetes_version({"version": "v1.35.6"}, news)
    assert str(err.value).startswith("zones[0].kubernetesVersion: the Kubernetes upgrade v1.35.6 → v1.36.0 was refused")
    assert f"kube-apiserver feature gate {GATE_136}" in str(err.value)
    clean, clean_web = render()
    assert kv.diff_kubernetes_version({"version": "v1.35.6"}, {**news, "configs": {"controlplane": clean,
                                                                                   "web": clean_web}}).changes
