"""The CRD sets the lab's tests install directly, and a bounded installer for any list of CRDs.

The sets are the pinned upstream ones (lab/upstream.py): the Gateway API standard channel and
cert-manager's CRDs, read from their Go module zips.
"""

from __future__ import annotations

import logging

import yaml
from kubernetes import client

from lab import upstream
from lab.process import wait_until

REQUEST_TIMEOUT = 10.0  # seconds, per API call
ESTABLISH_TIMEOUT = 30.0  # seconds for every CRD of one install to be Established

log = logging.getLogger(__name__)


def _load(artifact: str) -> list[dict]:
    docs = []
    for p in sorted(upstream.prepare(artifact).glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(p.read_text()) if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"]
    return docs


def gateway_api() -> list[dict]:
    """The Gateway API standard-channel CRDs at the pinned version."""
    return _load("gateway-api")


def cert_manager() -> list[dict]:
    """cert-manager's CRDs at the pinned version."""
    return _load("cert-manager-crds")


def apply(api_client: client.ApiClient, manifests: list[dict], *, timeout: float = ESTABLISH_TIMEOUT) -> None:
    """Create or replace each CRD, then wait (bounded) until all are Established.

    Replace keeps the server's resourceVersion, so re-running converges instead of failing on
    409 Conflict.
    """
    ext = client.ApiextensionsV1Api(api_client)
    for crd in manifests:
        name = crd["metadata"]["name"]
        try:
            ext.create_custom_resource_definition(crd, _request_timeout=REQUEST_TIMEOUT)
            log.info("created CRD %s", name)
        except client.ApiException as e:
            if e.status != 409:
                raise
            current = ext.read_custom_resource_definition(name, _request_timeout=REQUEST_TIMEOUT)
            body = dict(crd, metadata=dict(crd["metadata"], resourceVersion=current.metadata.resource_version))
            ext.replace_custom_resource_definition(name, body, _request_timeout=REQUEST_TIMEOUT)
            log.info("replaced CRD %s", name)
    wait_established(api_client, [c["metadata"]["name"] for c in manifests], timeout=timeout)


def wait_established(api_client: client.ApiClient, names: list[str], *, timeout: float = ESTABLISH_TIMEOUT) -> None:
    """Block until every named CRD reports Established=True, or raise TimeoutError naming the laggards."""
    ext = client.ApiextensionsV1Api(api_client)

    def established() -> bool:
        pending = []
        for name in names:
            crd = ext.read_custom_resource_definition(name, _request_timeout=REQUEST_TIMEOUT)
            conditions = (crd.status.conditions if crd.status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                pending.append(name)
        if pending:  # raised, so the timeout message names what was still pending
            raise RuntimeError(f"not yet Established: {', '.join(pending)}")
        return True

    wait_until(f"CRDs Established: {', '.join(names)}", established, timeout, interval=0.2)
