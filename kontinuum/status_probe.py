"""The read-only, bounded look `python -m kontinuum status` takes at one zone (fleet_status.py
judges it): from the stack's state the configured versions, the credentials and the backup
folder; from the zone itself each node's Talos version, etcd's health, the Nodes and the zone's
TLS certificate. Nothing is changed anywhere; every call has its own bound.
"""

from __future__ import annotations

import base64
import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client

from kontinuum.backup import files, store as stores
from kontinuum.backup.verify import newest_with_failures
from kontinuum.backup.stack_state import resource_name, resource_props, zone_access, zone_kubeconfig
from kontinuum.errors import KontinuumError
from kontinuum.fleet_status import Observation
from kontinuum.hub.crds import ZONE_NAMESPACE
from kontinuum.kube.clients import api_client, describe_error
from kontinuum.lifecycle import etcd_health
from kontinuum.talos import renewal, secrets, talosconfig
from kontinuum.talos.errors import TalosError

TLS_SECRET = "kontinuum-tls"  # the zone footprint's certificate (kontinuum_components/downstream.py)


def zones_of(deployment: dict) -> tuple[str | None, list[str]]:
    """(region, zone names) the stack's state holds."""
    resources = deployment.get("resources") or []
    root = next((r for r in resources if r.get("type") == "pulumi:pulumi:Stack"), None)
    region = ((root or {}).get("outputs") or {}).get("region")
    zones = sorted(resource_name(r["urn"])[len(region) + 1:] for r in resources
                   if region and r.get("type") == "kontinuum:index:Zone" and resource_name(r["urn"]).startswith(f"{region}-"))
    return region, zones


def configured_versions(deployment: dict, cluster: str) -> tuple[str | None, str | None]:
    talos = kubernetes = None
    for r in deployment.get("resources") or []:
        if not r.get("custom"):
            continue
        if r["type"].endswith(":TalosUpgrade") and (r.get("parent") or "").endswith(f"TalosCluster::{cluster}"):
            talos = talos or resource_props(r).get("talosVersion")
        elif resource_name(r["urn"]) == f"{cluster}-kubernetes-version":
            kubernetes = resource_props(r).get("version")
    return talos, kubernetes


def renew_before_days(deployment: dict, cluster: str) -> float | None:
    """The zone's certificates.renewBefore, as its TalosSecrets recorded it at the last up."""
    for r in deployment.get("resources") or []:
        if r.get("custom") and resource_name(r["urn"]) == f"{cluster}-secrets":
            days = resource_props(r).get("renewBeforeDays")
            return float(days) if days is not None else None
    return None


def observe(deployment: dict, stack: str, zone: str, *, timeout: float, now: dt.datetime) -> Observation:
    access, settings = zone_access(deployment, stack, zone)
    o = Observation(access.cluster)
    o.configured_talos, o.configured_kubernetes = configured_versions(deployment, access.cluster)
    o.renew_before_days = renew_before_days(deployment, access.cluster)
    bundle = secrets.load(access.secrets_yaml, check_rsa=False)
    admin = zone_kubeconfig(deployment, access.cluster)
    o.expiries = {"the Talos API CA": renewal.expiry(bundle.os.crt), "the Kubernetes CA": renewal.expiry(bundle.k8s.crt),
                  "the etcd CA": renewal.expiry(bundle.etcd.crt),
                  "the admin talosconfig": renewal.expiry(talosconfig.parse(access.talosconfig).crt),
                  "the admin kubeconfig": renewal.expiry(renewal.kubeconfig_cert(admin))}
    if access.backup_talosconfig:
        o.expiries["the backup talosconfig"] = renewal.expiry(talosconfig.parse(access.backup_talosconfig).crt)
    nodes = [*access.control_planes, *access.workers]
    with ThreadPoolExecutor(max_workers=min(8, len(nodes))) as pool:
        o.talos = dict(zip(nodes, pool.map(lambda n: _version(access, n, timeout), nodes)))
    if any(o.talos.get(cp) for cp in access.control_planes):
        o.etcd_problem = etcd_health.problem(access.client, list(access.control_planes), timeout)
    _kubernetes(o, admin, timeout)
    if settings is not None:
        _backup(o, stores.for_zone(settings.destination, stack, access.cluster))
    return o


def _version(access, node: str, timeout: float) -> str | None:
    try:
        return access.client(node).version(timeout=timeout).tag
    except TalosError:
        return None


def _kubernetes(o: Observation, kubeconfig: str, timeout: float) -> None:
    api = api_client(kubeconfig, retries=0)
    try:
        core = client.CoreV1Api(api)
        for node in core.list_node(_request_timeout=timeout).items:
            ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
            o.nodes[node.metadata.name] = (ready, node.status.node_info.kubelet_version if node.status.node_info else "")
        try:
            secret = core.read_namespaced_secret(TLS_SECRET, ZONE_NAMESPACE, _request_timeout=timeout)
            crt = base64.b64decode((secret.data or {}).get("tls.crt", ""))
            if crt:
                o.expiries["the zone's TLS certificate"] = renewal.expiry(crt)
        except client.ApiException as e:
            if e.status != 404:
                raise
    except Exception as e:  # noqa: BLE001 - any failure to read the API is what the status reports
        o.api_problem = describe_error(e)
    finally:
        api.close()


def _backup(o: Observation, store) -> None:
    """The newest backup and the newest one verified to restore, in a folder or a bucket."""
    try:
        latest, verified, verified_at, o.backup_failed = newest_with_failures(store, o.cluster)
    except KontinuumError as e:
        o.backup_problem = str(e)
        return
    if latest:
        o.backup_path, o.backup_at = store.describe(latest), files.taken_at(latest)
        o.backup_verified = latest == verified
    if verified:
        o.verified_path, o.verified_at = store.describe(verified), files.taken_at(verified)
        o.verified_checked_at = verified_at


def observe_stack(deployment: dict, stack: str, *, timeout: float, now: dt.datetime) -> tuple[str | None, list]:
    """(region, [Observation or (zone, error text)]) for every zone of the stack, zones in parallel."""
    region, zones = zones_of(deployment)

    def one(zone: str):
        try:
            return observe(deployment, stack, zone, timeout=timeout, now=now)
        except KontinuumError as e:
            return zone, str(e)

    with ThreadPoolExecutor(max_workers=max(1, min(4, len(zones)))) as pool:
        return region, list(pool.map(one, zones))
