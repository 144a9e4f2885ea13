"""Flux objects an uninstall would leave stuck (kontinuum/kube/flux_teardown.py): released only
once no Flux controller pod is left, only while being deleted, only Flux's finalizer, and never
over a change made since they were read."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
from kubernetes import client

from kontinuum.kube import flux_teardown

KS = ("kustomize.toolkit.fluxcd.io", "v1", "kustomizations")


def kustomization(name, *, deleting=True, finalizers=("finalizers.fluxcd.io",), namespace="flux-system", rv="7"):
    md = {"name": name, "namespace": namespace, "resourceVersion": rv, "finalizers": list(finalizers)}
    if deleting:
        md["deletionTimestamp"] = "2026-12-03T07:18:28Z"
    return {"kind": "Kustomization", "metadata": md}


class Fake:
    def __init__(self, pods=(), objects=(), conflict=()):
        self.pods, self.objects, self.conflict, self.patches, self.pod_selectors = list(pods), list(objects), set(conflict), [], []

    def list_namespaced_pod(self, namespace, label_selector, **_):
        self.pod_selectors.append(label_selector)
        return NS(items=self.pods)

    def list_custom_resource_definition(self, **_):
        version = NS(name="v1", served=True, storage=True)
        return NS(items=[NS(spec=NS(group="kustomize.toolkit.fluxcd.io", versions=[version], names=NS(plural="kustomizations"))),
                         NS(spec=NS(group="cert-manager.io", versions=[version], names=NS(plural="certificates")))])

    def list_cluster_custom_object(self, group, version, plural, **_):
        assert (group, version, plural) == KS, "only Flux's kinds are listed"
        return {"items": self.objects}

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body, **_):
        if name in self.conflict:
            raise client.ApiException(status=409)
        self.patches.append((name, body))


@pytest.fixture
def fake(monkeypatch):
    f = Fake()
    for api in ("CoreV1Api", "CustomObjectsApi", "ApiextensionsV1Api"):
        monkeypatch.setattr(flux_teardown.client, api, lambda _api, f=f: f)
    return f


def test_nothing_is_released_while_a_flux_controller_pod_is_left(fake):
    fake.pods = [NS(metadata=NS(name="kustomize-controller-abc"))]
    fake.objects = [kustomization("infrastructure")]
    assert flux_teardown.release_orphans(object(), "flux-system") == []
    assert fake.patches == [] and "kustomize-controller" in fake.pod_selectors[0]


def test_only_objects_being_deleted_lose_only_fluxs_finalizer(fake):
    fake.objects = [kustomization("infrastructure", finalizers=("finalizers.fluxcd.io", "example.com/keep")),
                    kustomization("live", deleting=False), kustomization("other", finalizers=("example.com/keep",))]
    assert flux_teardown.release_orphans(object(), "flux-system") == ["Kustomization flux-system/infrastructure"]
    assert fake.patches == [("infrastructure", {"metadata": {"resourceVersion": "7", "finalizers": ["example.com/keep"]}})]


def test_an_object_changed_since_it_was_read_is_left_for_the_next_poll(fake):
    fake.objects = [kustomization("apps"), kustomization("infrastructure")]
    fake.conflict = {"apps"}
    assert flux_teardown.release_orphans(object(), "flux-system") == ["Kustomization flux-system/infrastructure"]
