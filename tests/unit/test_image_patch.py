"""One component's image set in a live machine config, nothing else (kontinuum/lifecycle/
image_patch.py): the bytes around it stay as the node has them."""

from __future__ import annotations

import pytest
import yaml

from kontinuum.lifecycle import image_patch
from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets
from kontinuum.talos.clusterspec import ClusterSpec


@pytest.fixture(scope="module")
def rendered() -> str:
    return mc.render(ClusterSpec(name="z", endpoint="https://127.0.62.9:6443", kubernetes_version="1.35.4"),
                     secrets.generate()).decode()


@pytest.mark.parametrize("component", list(image_patch.IMAGE_PATHS))
def test_only_the_image_bytes_change(rendered, component):
    old = image_patch.image_in(rendered, component)
    assert old and old.endswith(":v1.35.4")
    new = old.replace(":v1.35.4", ":v1.36.0")
    patched = image_patch.with_image(rendered, component, new)
    assert patched == rendered.replace(old, new) and patched != rendered
    assert image_patch.image_in(patched, component) == new
    assert image_patch.with_image(patched, component, new) == patched  # already there: nothing changes


def test_a_config_without_the_image_gets_it_every_other_value_kept():
    live = yaml.safe_dump_all([{"version": "v1alpha1", "machine": {"type": "worker", "files": [{"permissions": 420}]},
                                "cluster": {"clusterName": "z"}},
                               {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "hostname": "x"}])
    patched = image_patch.with_image(live, "kube-scheduler", "registry.k8s.io/kube-scheduler:v1.36.0")
    docs = list(yaml.safe_load_all(patched))
    assert docs[0]["cluster"] == {"clusterName": "z", "scheduler": {"image": "registry.k8s.io/kube-scheduler:v1.36.0"}}
    assert docs[0]["machine"] == {"type": "worker", "files": [{"permissions": 420}]} and docs[1]["kind"] == "HostnameConfig"


def test_a_longer_image_that_contains_the_current_one_is_left_alone():
    live = ("version: v1alpha1\nmachine:\n  kubelet:\n    image: r.io/kubelet:v1.35.4\n"
            "  note: r.io/kubelet:v1.35.40\ncluster: {}\n")
    assert image_patch.with_image(live, "kubelet", "r.io/kubelet:v1.36.0") == live.replace(
        "image: r.io/kubelet:v1.35.4\n", "image: r.io/kubelet:v1.36.0\n")


def test_no_v1alpha1_document_is_an_error():
    with pytest.raises(image_patch.NoV1Alpha1):
        image_patch.image_in("apiVersion: v1alpha1\nkind: HostnameConfig\n", "kubelet")
