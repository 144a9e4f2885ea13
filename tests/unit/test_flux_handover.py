"""The Flux hand-off's later life (issue 29): retiring old credentials only once the sync ran
from the current source, drift of the FluxInstance, and the hand-over mode's note."""

from __future__ import annotations

import pytest
from kubernetes import client

from kontinuum.kube import flux_manifests, flux_sync
from kontinuum_components import flux as component
from tests.unit.test_flux_config import stack

NS, URL = "flux-system", "https://git.example/fleet"
REV = "refs/heads/main@sha1:abc"


class FakeCustom:
    def __init__(self, objects: dict):
        self.objects = objects

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **_):
        if (plural, name) not in self.objects:
            raise client.ApiException(status=404)
        return self.objects[(plural, name)]


def source(url=URL, ready="True", revision=REV):
    return {"metadata": {"generation": 2}, "spec": {"url": url},
            "status": {"conditions": [{"type": "Ready", "status": ready, "observedGeneration": 2, "message": "m"}],
                       "artifact": {"revision": revision}}}


def kustomization(applied=REV, ready="True", generation=1, observed=1):
    return {"metadata": {"generation": generation}, "status": {"lastAppliedRevision": applied, "conditions": [
        {"type": "Ready", "status": ready, "observedGeneration": observed, "message": f"Applied revision: {applied}"}]}}


@pytest.mark.parametrize("objects, want", [
    ({}, "GitRepository flux-system/flux-system does not exist yet"),
    ({("gitrepositories", NS): source(url="https://old.example/fleet")}, "still reads 'https://old.example/fleet'"),
    ({("gitrepositories", NS): source(ready="False")}, "not fetched: Ready=False"),
    ({("gitrepositories", NS): source()}, "Kustomization flux-system/flux-system does not exist yet"),
    ({("gitrepositories", NS): source(), ("kustomizations", NS): kustomization(applied="refs/heads/main@sha1:old")},
     "has not applied refs/heads/main@sha1:abc yet"),
    ({("gitrepositories", NS): source(), ("kustomizations", NS): kustomization(generation=2, observed=1)},
     "has not applied"),
])
def test_the_new_source_is_proven_only_once_its_revision_was_applied(objects, want):
    revision, problem = flux_sync.problem(FakeCustom(objects), NS, "GitRepository", URL)
    assert revision is None and want in problem


def test_proven_returns_the_applied_revision():
    objects = {("gitrepositories", NS): source(), ("kustomizations", NS): kustomization()}
    assert flux_sync.problem(FakeCustom(objects), NS, "GitRepository", URL) == (REV, None)


OURS = {"apiVersion": "fluxcd.controlplane.io/v1", "kind": "FluxInstance",
        "metadata": {"name": "flux", "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "kontinuum"}},
        "spec": {"distribution": {"version": "2.9.x", "registry": "ghcr.io/fluxcd"},
                 "sync": {"kind": "GitRepository", "url": URL, "interval": "1m"}}}


def live(**spec_changes) -> dict:
    obj = {**OURS, "metadata": {**OURS["metadata"], "uid": "u", "generation": 3,
                                "labels": {**OURS["metadata"]["labels"], "other": "x"}},
           "spec": {**OURS["spec"], "cluster": {"type": "kubernetes", "domain": "cluster.local"}, **spec_changes},
           "status": {"conditions": []}}
    return obj


def test_defaults_and_fields_others_set_are_not_drift():
    assert flux_manifests.instance_view(OURS, live()) == OURS


def test_a_changed_or_removed_field_of_ours_is_drift():
    changed = flux_manifests.instance_view(OURS, live(sync={**OURS["spec"]["sync"], "interval": "7m"}))
    assert changed["spec"]["sync"]["interval"] == "7m"
    removed = flux_manifests.instance_view(OURS, live(sync={"kind": "GitRepository", "url": URL}))
    assert "interval" not in removed["spec"]["sync"]


def test_a_kustomize_patch_someone_added_is_drift():
    patched = flux_manifests.instance_view(OURS, live(kustomize={"patches": [{"patch": "x"}]}))
    assert patched["spec"]["kustomize"] == {"patches": [{"patch": "x"}]} and patched != OURS


def test_the_hand_over_note_names_what_stays():
    cfg, problems = stack({"source": {"url": URL, "credential": "primary"}, "handOver": True,
                           "credentials": {"primary": {"token": "t0ken"}}})
    assert not problems, problems
    flux = cfg.zones[0].flux
    assert flux.hand_over
    note = component.handover_note(flux)
    assert all(s in note for s in ("namespace flux-system", "Helm release flux-system/flux-operator",
                                   "FluxInstance flux-system/flux", "Secret flux-system/primary"))
    assert "t0ken" not in note
