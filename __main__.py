"""Kontinuum: one stack per region; each zone in `kontinuum:zones` becomes a Talos cluster.

Reads and validates the whole stack config before registering anything, then wires one Zone
component per zone and exports each zone's URL, readiness, kubeconfig (secret) and identity
thumbprint.
"""

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from kontinuum.errors import ConfigError
from kontinuum_components.config import parse
from kontinuum_components.zone import Zone, validate_zone

KEYS = ("region", "hub", "zones", "defaults")

cfg = pulumi.Config("kontinuum")
raw = {k: cfg.get_object(k) if k != "region" else cfg.get(k) for k in KEYS}
try:
    stack = parse({k: v for k, v in raw.items() if v is not None})
    for i, z in enumerate(stack.zones):
        validate_zone(stack.region, z, f"zones[{i}].")
except ConfigError as e:
    # Config problems are the operator's to fix: one clean message per path, no traceback.
    raise pulumi.RunError(f"invalid stack config (kontinuum:…):\n{e}") from None

def hub_kubeconfig() -> pulumi.Output[str]:
    """The hub kubeconfig: a secret value (real regions) or a file the lab writes."""
    path = cfg.get("hubKubeconfigFile")
    if not path:
        return cfg.require_secret("hubKubeconfig")
    try:
        return pulumi.Output.secret(Path(path).read_text())
    except OSError as e:
        if pulumi.runtime.is_dry_run():
            # A preview contacts nothing, so a missing lab kubeconfig only costs accuracy.
            pulumi.log.warn(f"kontinuum:hubKubeconfigFile {path}: {e.strerror}; previewing without the hub")
            return pulumi.Output.secret(PLACEHOLDER_KUBECONFIG)
        raise pulumi.RunError(f"kontinuum:hubKubeconfigFile: cannot read {path} ({e.strerror}); "
                              "start the lab with `python -m lab up` or set kontinuum:hubKubeconfig") from None


PLACEHOLDER_KUBECONFIG = (
    "apiVersion: v1\nkind: Config\nclusters: [{name: hub, cluster: {server: 'https://127.0.0.1:1'}}]\n"
    "users: [{name: hub, user: {}}]\ncontexts: [{name: hub, context: {cluster: hub, user: hub}}]\n"
    "current-context: hub\n"
)
hub = hub_kubeconfig()
hub_provider = k8s.Provider(f"{stack.region}-hub", kubeconfig=hub)
zones = {}
for z in stack.zones:
    zones[z.zone] = Zone(f"{stack.region}-{z.zone}", region=stack.region, hub=stack.hub, zone=z,
                         hub_kubeconfig=hub, hub_provider=hub_provider)

pulumi.export("region", stack.region)
pulumi.export("zones", {name: {"url": zone.url, "ready": zone.ready, "identityThumbprint": zone.identity_thumbprint}
                        for name, zone in zones.items()})
pulumi.export("kubeconfigs", pulumi.Output.secret({name: zone.kubeconfig for name, zone in zones.items()}))
