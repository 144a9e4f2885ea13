"""Zone `<region>-<zone>`: seed Instances, a TalosCluster, the zone identity, the downstream
footprint and the registry join (seeds, "Add zone"; DESIGN §4). Only wiring.

Teardown is the reverse of the graph: the registry wait and downstream objects go first,
then the addons, then every node is reset to maintenance, the claims are released and the
Instances unregistered only when `unregisterInstancesOnDelete` asks for it.
"""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from kontinuum.backup.destination import resolve as resolve_destination
from kontinuum.hub.crds import LABEL_LOST, LABEL_REGION, LABEL_ZONE
from kontinuum.naming import instance_name
from kontinuum.stackconfig import model, specs
from kontinuum_components.access import people_bindings
from kontinuum_components.downstream import DownstreamFootprint
from kontinuum_components.flux import FluxHandOff
from kontinuum_components.talos_cluster import LABEL_POOL, TalosCluster
from providers.etcd_backup import EtcdBackup
from providers.instance import Instance
from providers.registry_join import RegistryJoin
from providers.teardown_guard import TeardownGuard
from providers.zone_identity import ZoneIdentity


def zone_url(region: str, zone: str, hub: model.Hub) -> str:
    return f"https://{zone}.{region}.{hub.dns_domain}"


GUARD_TIMEOUT = 60.0  # seconds at most to wait for a zone API server at teardown

HATCH_REMEDY = (
    "set `teardown: {{skipUnreachableCluster: true}}` on zone {zone} in the stack config (kontinuum:zones), run "
    "`pulumi up` (it records the choice and calls nothing on the dead cluster), then run this again: the objects "
    "on the cluster are dropped from the state, the nodes that answer are reset and the claims released."
)


def validate_zone(region: str, zone: model.Zone, prefix: str) -> None:
    specs.validate(f"{region}-{zone.zone}", zone, prefix)


class Zone(pulumi.ComponentResource):
    def __init__(self, name: str, *, region: str, hub: model.Hub, zone: model.Zone,
                 hub_kubeconfig: pulumi.Input[str], hub_provider: k8s.Provider, path: str = "zones[]",
                 tsig_keys: dict | None = None, opts: pulumi.ResourceOptions | None = None):
        """hub_provider: the stack's one Kubernetes provider for the hub (a provider process per
        zone would be one more plugin to start per zone for the same cluster). path: the zone's
        place in the stack config (`zones[0]`); tsig_keys: kontinuum:dnsTsigKeys, parsed."""
        super().__init__("kontinuum:index:Zone", name, None, opts)
        t = zone.timeouts
        instances = {
            m: Instance(
                instance_name(region, zone.zone, m.addresses[0]),
                name=instance_name(region, zone.zone, m.addresses[0]),
                interfaces=list(m.addresses),
                # A lost machine's Instance says so (its teardown then never calls it); the mark goes
                # when the machine is no longer declared lost.
                labels={LABEL_REGION: region, LABEL_ZONE: zone.zone, LABEL_POOL: m.pool,
                        **({LABEL_LOST: "true"} if m.lost else {})},
                hub_kubeconfig=hub_kubeconfig,
                unregister_on_delete=zone.unregister_instances_on_delete,
                talos_port=zone.talos_port,
                probe_timeout=float(t["discovery"]),
                opts=pulumi.ResourceOptions(parent=self),
            )
            for m in zone.machines
        }
        cluster = TalosCluster(name, region=region, zone=zone, hub_kubeconfig=hub_kubeconfig, instances=instances,
                               opts=pulumi.ResourceOptions(parent=self))
        people_bindings(cluster, after=[cluster.control_plane_ready_resource])  # for people's kubeconfigs
        # The GitOps hand-off (seed 002): right after Cilium's release, before its health gate.
        handoff = FluxHandOff(name, cluster=cluster, flux=zone.flux, kubeconfig=cluster.kubeconfig,
                              after=[cluster.cilium_release], timeout=float(t["flux"]),
                              opts=pulumi.ResourceOptions(parent=self)) if zone.flux else None
        identity = ZoneIdentity(f"{name}-identity", region=region, zone=zone.zone,
                                opts=pulumi.ResourceOptions(parent=self))
        footprint = DownstreamFootprint(
            name, region=region, zone=zone, hub=hub, zone_provider=cluster.provider, hub_provider=hub_provider,
            zone_kubeconfig=cluster.kubeconfig, identity=identity, depends_on=cluster.addons_ready, path=path,
            tsig_keys=tsig_keys, member_addresses=cluster.member_addresses, opts=pulumi.ResourceOptions(parent=self))
        join = RegistryJoin(f"{name}-join", hub_kubeconfig=hub_kubeconfig, region=region, zone=zone.zone,
                            timeout=float(t["registryJoin"]), trigger=footprint.revision,
                            zone_kubeconfig=cluster.kubeconfig,
                            opts=pulumi.ResourceOptions(parent=self, depends_on=[footprint]))

        # The zone's only leaf, so teardown deletes it before anything else (the join included,
        # which a re-run would otherwise have to wait for again): a dead cluster fails teardown
        # once, bounded, saying what to do. With the escape hatch it is retained and never runs.
        TeardownGuard(f"{name}-teardown-guard", kubeconfig=cluster.kubeconfig, zone=name,
                      timeout=min(float(t["teardown"]), GUARD_TIMEOUT),
                      skip_unreachable=zone.skip_unreachable_cluster, remedy=HATCH_REMEDY.format(zone=zone.zone),
                      opts=pulumi.ResourceOptions(parent=self, depends_on=[cluster, footprint, join,
                                                                         *([handoff] if handoff else [])],
                                                  retain_on_delete=zone.skip_unreachable_cluster))

        # The zone's backup key, and with backup.onUp a snapshot per up once the control plane is ready.
        backup = EtcdBackup(f"{name}-etcd-backup", cluster=name, stack=pulumi.get_stack(),
                            destination=resolve_destination(zone.backup.destination, Path.cwd()),
                            keep=zone.backup.keep, on_up=zone.backup.on_up, secrets_yaml=cluster.secrets_yaml,
                            control_planes=cluster.control_plane_addresses, talos_port=zone.talos_port,
                            renew_before_days=zone.renew_before_days,
                            opts=pulumi.ResourceOptions(parent=self,
                                                        depends_on=[cluster.control_plane_ready_resource]))
        self.backup_talosconfig = backup.backupTalosconfig  # os:etcd:backup only, a secret

        self.url = pulumi.Output.from_input(zone_url(region, zone.zone, hub))
        self.addresses, self.dns_records = footprint.addresses, footprint.dns_records
        self.dns_mode = zone.dns.mode
        self.ready = pulumi.Output.all(cluster.ready, footprint.installed, join.joined,
                                       *([handoff.ready] if handoff else [])).apply(all)
        self.kubeconfig = cluster.kubeconfig
        self.talosconfig = cluster.talosconfig
        self.identity_thumbprint = identity.thumbprint
        self.talosconfig_expires = cluster.talosconfig_expires
        self.kubeconfig_expires = cluster.kubeconfig_expires
        self.cluster = cluster
        self.register_outputs({"url": self.url, "ready": self.ready, "identityThumbprint": self.identity_thumbprint,
                               "addresses": self.addresses})
