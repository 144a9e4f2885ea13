"""The emulator's k8s COSI resources (lab/talos_node/k8s_resources.py): StaticPods and the
KubeletSpec built from a node's config as Talos builds them, and `talos.dev/config-version` a
counter per node and component that goes up only when that component's config changes."""

from __future__ import annotations

import copy

from lab.talos_node import k8s_resources as kr
from lab.talos_node import resources


def doc(**api_args) -> dict:
    return {"version": "v1alpha1", "machine": {"type": "controlplane", "kubelet": {"image": "ghcr.io/siderolabs/kubelet:v1.35.4"}},
            "cluster": {"controlPlane": {"endpoint": "https://127.0.62.9:6443"},
                        "apiServer": {"image": "registry.k8s.io/kube-apiserver:v1.35.4", "extraArgs": api_args},
                        "scheduler": {"image": "registry.k8s.io/kube-scheduler:v1.35.4"}}}


def test_static_pod_command_merges_extra_args_as_talos_does():
    pod = kr.static_pod(doc(**{"feature-gates": "A=true", "enable-admission-plugins": ["PodNodeSelector"],
                               "profiling": "true"}), "kube-apiserver", address="127.0.62.1")
    command = pod["spec"]["containers"][0]["command"]
    assert command[0] == "/usr/local/bin/kube-apiserver" and command[1:] == sorted(command[1:])
    assert "--enable-admission-plugins=NodeRestriction,PodNodeSelector" in command  # additive
    assert "--feature-gates=A=true" in command and "--profiling=true" in command and "--profiling=false" not in command
    assert pod["metadata"]["labels"]["k8s-app"] == "kube-apiserver"
    assert pod["spec"]["containers"][0]["image"] == "registry.k8s.io/kube-apiserver:v1.35.4"


def test_config_version_goes_up_only_when_that_components_config_changes():
    address = "127.0.62.2"
    d = doc()
    v = {c: kr.config_version(address, d, c) for c in ("kube-apiserver", "kube-scheduler", "kubelet")}
    assert v == {"kube-apiserver": 1, "kube-scheduler": 1, "kubelet": 1}
    assert kr.config_version(address, copy.deepcopy(d), "kube-apiserver") == 1  # same config: same version
    changed = copy.deepcopy(d)
    changed["cluster"]["apiServer"]["image"] = "registry.k8s.io/kube-apiserver:v1.35.5"
    assert kr.config_version(address, changed, "kube-apiserver") == 2
    assert kr.config_version(address, changed, "kube-scheduler") == 1
    assert kr.config_version("127.0.62.3", changed, "kube-apiserver") == 1  # per node
    pod = kr.static_pod(changed, "kube-apiserver", address=address)
    assert pod["metadata"]["annotations"][kr.CONFIG_VERSION] == "2"


def test_the_node_serves_static_pods_on_control_planes_and_a_kubelet_spec_everywhere():
    import yaml

    cp = yaml.safe_dump(doc()).encode()
    worker = yaml.safe_dump({**doc(), "machine": {"type": "worker", "kubelet": {"extraArgs": {"node-ip": "10.0.0.1"}}}}).encode()
    facts = resources.NodeFacts(address="127.0.62.4", talos_version="v1.13.0", stage="running", ready=True, config=cp)
    served = resources.specs(facts)
    assert sorted(served[(kr.NAMESPACE, kr.STATIC_POD)]) == sorted(kr.STATIC_PODS)
    spec = served[(kr.NAMESPACE, kr.KUBELET_SPEC)]["kubelet"][0]
    assert "--hostname-override=talos-127-0-62-4" in spec["args"] and spec["image"].endswith("kubelet:v1.35.4")
    served = resources.specs(resources.NodeFacts(address="127.0.62.5", talos_version="v1.13.0", stage="running",
                                                 ready=True, config=worker))
    assert served[(kr.NAMESPACE, kr.STATIC_POD)] == {}
    assert "--node-ip=10.0.0.1" in served[(kr.NAMESPACE, kr.KUBELET_SPEC)]["kubelet"][0]["args"]
    assert (kr.NAMESPACE, kr.KUBELET_SPEC) not in resources.specs(
        resources.NodeFacts(address="127.0.62.6", talos_version="v1.13.0", stage="maintenance", ready=True))
    assert {kr.STATIC_POD, kr.KUBELET_SPEC} <= set(resources.DEFINITIONS) and kr.NAMESPACE in resources.NAMESPACES


def _fields(data: bytes) -> list[tuple[int, bytes]]:
    """Length-delimited protobuf fields (number, payload), in order."""
    out, i = [], 0
    while i < len(data):
        key, i = data[i], i + 1
        length = shift = 0
        while True:
            byte, i = data[i], i + 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        out.append((key >> 3, data[i:i + length]))
        i += length
    return out


def test_the_protobuf_forms_decode_as_talos_messages():
    from google.protobuf import json_format, struct_pb2

    pod = kr.static_pod(doc(), "kube-scheduler", address="127.0.62.7")
    [(number, payload)] = _fields(kr.static_pod_proto(pod))
    assert number == 1 and json_format.MessageToDict(struct_pb2.Struct.FromString(payload)) == pod
    spec = kr.kubelet_spec(doc(), hostname="n1", address="127.0.62.7")
    fields = _fields(kr.kubelet_spec_proto(spec))
    assert [f for f, _ in fields] == [1] + [2] * len(spec["args"]) + [4, 5]
    assert [p.decode() for f, p in fields if f == 2] == spec["args"] and fields[0][1].decode() == spec["image"]


def test_a_mirror_pod_takes_image_and_config_version_from_one_read_of_the_config():
    """The lab's pass read its member info (images) before a config that upgrades the
    controller-manager was applied and the config itself after: the mirror Pod was recreated on
    the old image with the new version (an extra, wrong "static-pod" event, seen in the suite's
    day-2 e2e). It follows the config it read, once."""
    from types import SimpleNamespace as NS

    import yaml

    from lab import static_pods
    from lab.cluster_config import MemberInfo

    address, hostname = "127.0.62.13", "cp-3"
    old = doc()
    new = copy.deepcopy(old)
    new["cluster"]["controllerManager"] = {"image": "registry.k8s.io/kube-controller-manager:v1.35.5"}
    member = MemberInfo(hostname, address, True)  # read before the upgrade was applied
    pods = [NS(metadata=NS(name=f"{c}-{hostname}", deletion_timestamp=None,
                           annotations={kr.CONFIG_VERSION: str(kr.config_version(address, old, c))}),
               spec=NS(containers=[NS(image=kr.image(old, c))])) for c in kr.STATIC_PODS]
    calls, events = [], []
    core = NS(list_namespaced_pod=lambda *a, **k: NS(items=pods),
              delete_namespaced_pod=lambda name, *a, **k: calls.append(("delete", name)),
              create_namespaced_pod=lambda ns, body, **k: calls.append(("create", body["spec"]["containers"][0]["image"])))
    machine = NS(config=NS(raw=yaml.safe_dump(new).encode()), record=lambda kind, **d: events.append(d["image"]))
    node = NS(metadata=NS(uid="uid-3"), status=NS(node_info=NS(kubelet_version=member.kubelet_version,
                                                               os_image=f"Talos ({member.talos_version})")))
    static_pods.reconcile(core, [(machine, member)], {hostname: node})
    assert calls == [("delete", f"kube-controller-manager-{hostname}"),
                     ("create", "registry.k8s.io/kube-controller-manager:v1.35.5")]
    assert events == ["registry.k8s.io/kube-controller-manager:v1.35.5"]
