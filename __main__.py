"""Kontinuum: one stack per region; each zone in `kontinuum:zones` becomes a Talos cluster.

Reads and validates the whole stack config before registering anything, then wires one Zone
component per zone and exports each zone's URL, readiness, kubeconfig (secret) and identity
thumbprint.
"""

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from kontinuum.stackconfig import validation
from kontinuum_components import sdk_speedups
from kontinuum_components.clean_exit import fail_cleanly, our_errors_cleanly
from kontinuum_components.zone import Zone
from providers.region_guard import RegionGuard

sdk_speedups.apply()  # before any resource: the SDK's end-of-program wait, linear instead of quadratic
cfg = pulumi.Config("kontinuum")


def _engine_config() -> tuple[dict, frozenset[str]]:
    """Every `kontinuum:*` key the engine passed (a typo'd key too), and which are secrets."""
    from pulumi.runtime import config as runtime_config

    values = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret = {k.partition(":")[2] for k in values if runtime_config.is_config_secret(k)}
    secret |= {k.partition(":")[2] for k in runtime_config.get_config_secret_keys_env()}
    return validation.from_engine(values), frozenset(secret)


# The whole contract, and every pool's rendered machine config judged by us and by Talos's
# own validator, before a single resource is registered (a preview shows it too).
raw, secret_keys = _engine_config()
checked = validation.validate(raw, secret_keys=secret_keys)
for note in checked.notes:
    pulumi.log.warn(note)
if checked.errors:
    # Config problems are the operator's to fix: one clean message per path, no traceback.
    fail_cleanly(f"invalid stack config (kontinuum:…):\n{checked.message()}")
stack = checked.stack
assert stack is not None


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
        fail_cleanly(f"kontinuum:hubKubeconfigFile: cannot read {path} ({e.strerror}); "
                     "start the lab with `python -m lab up` or set kontinuum:hubKubeconfig")


PLACEHOLDER_KUBECONFIG = (
    "apiVersion: v1\nkind: Config\nclusters: [{name: hub, cluster: {server: 'https://127.0.0.1:1'}}]\n"
    "users: [{name: hub, user: {}}]\ncontexts: [{name: hub, context: {cluster: hub, user: hub}}]\n"
    "current-context: hub\n"
)
# A config that lost every zone must not read as "tear the region down" (pulumi destroy does that).
RegionGuard(f"{stack.region}-region", region=stack.region, zones=[z.zone for z in stack.zones],
            allow_empty=stack.allow_empty_region)
hub = hub_kubeconfig()
hub_provider = k8s.Provider(f"{stack.region}-hub", kubeconfig=hub)
zones = {}
with our_errors_cleanly():  # e.g. a Gateway API bundle that cannot be fetched: its message, no traceback
    for i, z in zip(stack.zone_index, stack.zones):
        zones[z.zone] = Zone(f"{stack.region}-{z.zone}", region=stack.region, hub=stack.hub, zone=z,
                             hub_kubeconfig=hub, hub_provider=hub_provider, path=f"zones[{i}]",
                             tsig_keys=stack.tsig_keys)

pulumi.export("region", stack.region)
pulumi.export("zones", {name: {"url": zone.url, "ready": zone.ready, "identityThumbprint": zone.identity_thumbprint,
                               "addresses": zone.addresses,
                               "dns": {"mode": zone.dns_mode, "records": zone.dns_records},
                               "talosconfigExpires": zone.talosconfig_expires,
                               "kubeconfigExpires": zone.kubeconfig_expires}
                        for name, zone in zones.items()})
pulumi.export("kubeconfigs", pulumi.Output.secret({name: zone.kubeconfig for name, zone in zones.items()}))
# Per zone, the backup job's talosconfig: the os:etcd:backup role only (README: etcd backup and restore).
pulumi.export("backupTalosconfigs",
              pulumi.Output.secret({name: zone.backup_talosconfig for name, zone in zones.items()}))
