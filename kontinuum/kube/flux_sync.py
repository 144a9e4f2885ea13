"""Whether Flux runs from a source (seed 002: old credentials are retired "only after Flux has
run from the new source without problems").

The FluxInstance's sync creates a source (GitRepository or OCIRepository) and a Kustomization,
both named after the operator's namespace. The new source is proven when that source object has
the new URL, source-controller reports it Ready with an artifact, and kustomize-controller
reports the Kustomization Ready having applied that very artifact revision. Readiness of the
FluxInstance alone says nothing about the sync: its revision is the Flux distribution's.
"""

from __future__ import annotations

import time

from kubernetes import client

from kontinuum.errors import KontinuumError
from kontinuum.kube.clients import api_client, describe_error

SOURCE_GROUP, SOURCE_VERSION = "source.toolkit.fluxcd.io", "v1"
SOURCE_PLURALS = {"GitRepository": "gitrepositories", "OCIRepository": "ocirepositories"}
KS_GROUP, KS_VERSION, KS_PLURAL = "kustomize.toolkit.fluxcd.io", "v1", "kustomizations"
REQUEST_TIMEOUT = 15.0
POLL = 2.0


class SyncNotProven(KontinuumError):
    pass


def _ready(obj: dict) -> tuple[bool, str]:
    cond = next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    if cond is None:
        return False, "no Ready condition yet"
    current = cond.get("observedGeneration") in (None, (obj.get("metadata") or {}).get("generation"))
    return cond.get("status") == "True" and current, f"Ready={cond.get('status')}: {cond.get('message') or ''}".rstrip(": ")


def _get(custom: client.CustomObjectsApi, group: str, version: str, namespace: str, plural: str, name: str) -> dict | None:
    try:
        return custom.get_namespaced_custom_object(group, version, namespace, plural, name,
                                                   _request_timeout=REQUEST_TIMEOUT)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def problem(custom: client.CustomObjectsApi, namespace: str, kind: str, url: str) -> tuple[str | None, str | None]:
    """(the revision applied from `url`, None) once proven, else (None, what is not yet)."""
    plural = SOURCE_PLURALS[kind]
    source = _get(custom, SOURCE_GROUP, SOURCE_VERSION, namespace, plural, namespace)
    if source is None:
        return None, f"{kind} {namespace}/{namespace} does not exist yet"
    if (source.get("spec") or {}).get("url") != url:
        return None, f"{kind} {namespace}/{namespace} still reads {source.get('spec', {}).get('url')!r}"
    ok, text = _ready(source)
    revision = ((source.get("status") or {}).get("artifact") or {}).get("revision")
    if not ok or not revision:
        return None, f"{kind} {namespace}/{namespace} not fetched: {text}"
    ks = _get(custom, KS_GROUP, KS_VERSION, namespace, KS_PLURAL, namespace)
    if ks is None:
        return None, f"Kustomization {namespace}/{namespace} does not exist yet"
    ok, text = _ready(ks)
    applied = (ks.get("status") or {}).get("lastAppliedRevision")
    if not ok or applied != revision:
        return None, f"Kustomization {namespace}/{namespace} has not applied {revision} yet ({text}; applied: {applied})"
    return revision, None


def wait_proven(kubeconfig: str, namespace: str, kind: str, url: str, *, timeout: float) -> str:
    """Wait (bounded) until Flux has applied a revision from `url`; returns that revision."""
    api = api_client(kubeconfig)
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                revision, last = problem(custom, namespace, kind, url)
            except Exception as e:  # noqa: BLE001 - an unreachable apiserver is an observation too
                revision, last = None, f"cannot read the sync: {describe_error(e)}"
            if revision:
                return revision
            if time.monotonic() >= deadline:
                raise SyncNotProven(f"Flux has not run from {url} within {timeout:.0f} s: {last}")
            time.sleep(POLL)
    finally:
        api.close()
