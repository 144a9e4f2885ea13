"""The lab's own minimal CRD sets and a bounded installer for any list of CRDs.

The lab never fetches upstream bundles: `gateway-api/` holds our stand-ins for the Gateway
API standard channel (same groups, kinds, versions and shortNames; permissive schemas) and the
cert-manager CRDs live in the lab cert-manager chart (`charts/cert-manager/files/crds/`), where
its templates render them when `crds.enabled` is set. Real users point the addon config at the
upstream bundle and chart instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from kubernetes import client

from lab.process import wait_until

LAB = Path(__file__).resolve().parent.parent
GATEWAY_API_DIR = LAB / "crds" / "gateway-api"
CERT_MANAGER_CRDS_DIR = LAB / "charts" / "cert-manager" / "files" / "crds"
# The standard-channel release whose kinds and versions our stand-ins mirror.
GATEWAY_API_BUNDLE_VERSION = "v1.2.1"

REQUEST_TIMEOUT = 10.0  # seconds, per API call
ESTABLISH_TIMEOUT = 30.0  # seconds for every CRD of one install to be Established

log = logging.getLogger(__name__)


def _load_dir(directory: Path) -> list[dict]:
    return [yaml.safe_load(p.read_text()) for p in sorted(directory.glob("*.yaml"))]


def gateway_api() -> list[dict]:
    """Our Gateway API standard-channel CRDs (GatewayClass, Gateway, HTTPRoute, GRPCRoute, ReferenceGrant)."""
    return _load_dir(GATEWAY_API_DIR)


def cert_manager() -> list[dict]:
    """Our cert-manager CRDs exactly as the lab chart renders them with crds.enabled (keep annotation aside)."""
    return _load_dir(CERT_MANAGER_CRDS_DIR)


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
