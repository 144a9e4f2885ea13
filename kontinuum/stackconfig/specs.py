"""From stack config to the core library's typed specs (no Pulumi), so config errors in
machine-config terms (patches, labels, disks) surface before anything is registered."""

from __future__ import annotations

from kontinuum.errors import ConfigError
from kontinuum.kube import manifests
from kontinuum.talos.clusterspec import ClusterSpec, PoolSpec, validate_spec
from kontinuum.stackconfig.model import Pool, Zone


def cluster_spec(name: str, zone: Zone, endpoint: str) -> ClusterSpec:
    def pool_spec(p: Pool) -> PoolSpec:
        return PoolSpec(p.name, p.replicas, p.install_disk, p.node_labels, p.patches)

    return ClusterSpec(
        name=name,
        endpoint=endpoint,
        kubernetes_version=zone.kubernetes_version,
        control_plane=pool_spec(zone.control_plane),
        workers=tuple(pool_spec(w) for w in zone.workers if w.replicas > 0),
        installer_image=zone.upgrade.image(zone.talos_version),
        patches=zone.patches,
    )


def validate(name: str, zone: Zone, prefix: str) -> None:
    """Spec errors before anything is registered (the endpoint may only be known later)."""
    first = zone.machines[0].addresses[0] if zone.machines else "localhost"
    endpoint = zone.endpoint or f"https://{first}:6443"
    validate_spec(cluster_spec(name, zone, endpoint), prefix)
    if not manifests.is_url(zone.addons.gateway_api):  # a URL is fetched when the zone registers
        try:
            gateway_api_objects(zone.addons.gateway_api)
        except manifests.ManifestError as e:
            raise ConfigError(f"{prefix}addons.gatewayApi.source", str(e)) from None


_bundles: dict[str, list[dict]] = {}


def gateway_api_objects(source: str) -> list[dict]:
    """The Gateway API bundle's objects, read once per program run whatever the zone count."""
    if source not in _bundles:
        _bundles[source] = manifests.load(source)
    return _bundles[source]
