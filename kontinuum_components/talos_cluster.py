"""TalosCluster: the seeds' bootstrap state machine as a dependency graph (DESIGN §4).

TalosSecrets → control-plane pool → KubernetesVersion → ConfigRollout (reboots a change needs, node by
node behind the readiness gate) → ConfigApply per member machine → Bootstrap once → Kubeconfig →
Gateway API CRDs → Cilium (non-blocking) → Cilium pods healthy → Talos health check
(ControlPlaneReady) → worker pools + their ConfigApply, cert-manager → cert-manager healthy
(Ready). Each arrow is a resource dependency, so a failed or killed `pulumi up` resumes at
the first step that did not finish. This module only wires; the logic lives in providers/
and kontinuum/.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from kontinuum.hub.crds import LABEL_REGION, LABEL_ZONE
from kontinuum.naming import instance_name
from kontinuum.stackconfig.model import Machine, Pool, Zone
from kontinuum.stackconfig.specs import cluster_spec
from kontinuum.talos import config_view, machineconfig
from kontinuum.talos.secrets import load as load_secrets
from kontinuum_components import addons
from providers.bootstrap import Bootstrap
from providers.ca_rotation import CaRotation
from providers.cluster_health import ClusterHealth
from providers.config_apply import ConfigApply
from providers.config_rollout import ConfigRollout
from providers.instance import Instance
from providers.instance_pool import InstancePool
from providers.kubeconfig import Kubeconfig
from providers.kubernetes_version import KubernetesVersion
from providers.lost_machines import LostMachines
from providers.talos_secrets import TalosSecrets
from providers.talos_upgrade import TalosUpgrade

LABEL_POOL = "kontinuum.sh/pool"


class TalosCluster(pulumi.ComponentResource):
    """One zone's Talos Kubernetes cluster with its addons; outputs endpoint, kubeconfig,
    talosconfig (secrets), members and the ControlPlaneReady / Bootstrapped / Ready flags."""

    def __init__(self, name: str, *, region: str, zone: Zone, hub_kubeconfig: pulumi.Input[str],
                 instances: dict[Machine, Instance], opts: pulumi.ResourceOptions | None = None):
        """instances: every machine of the zone with its hub Instance. A pool's members are the
        first `replicas` machines listed for it, so membership is known to the program (and to
        a preview) and keyed by machine: each member's resources are named after its Instance."""
        super().__init__("kontinuum:index:TalosCluster", name, None, opts)
        self.name = name
        self.zone = zone
        t = zone.timeouts
        child = pulumi.ResourceOptions(parent=self)
        members = {p.name: pool_members(zone, p) for p in (zone.control_plane, *zone.workers)}
        iname = {m: instance_name(region, zone.zone, m.addresses[0]) for m in zone.machines}

        def address(m: Machine) -> pulumi.Input[str]:
            # Known to the program for one address; the discovered one when several are listed.
            return m.addresses[0] if len(m.addresses) == 1 else instances[m].address

        def lost_address(m: Machine) -> pulumi.Input[str]:
            # A lost machine is never probed: the one it answered on, else its first address.
            return m.addresses[0] if len(m.addresses) == 1 else instances[m].address.apply(lambda a: a or m.addresses[0])

        def pool(p: Pool, after: list[pulumi.Resource]) -> InstancePool:
            return InstancePool(
                f"{name}-{p.name}",
                pool=f"{name}-{p.name}",
                selector={LABEL_REGION: region, LABEL_ZONE: zone.zone, LABEL_POOL: p.name},
                replicas=p.replicas,
                machines={iname[m]: list(m.addresses) for m in members[p.name]},
                keep_one_member=p.name == zone.control_plane.name,
                hub_kubeconfig=hub_kubeconfig,
                wait_seconds=float(t["claim"]),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*after, *(instances[m] for m in members[p.name])]),
            )

        cp_members = members[zone.control_plane.name]
        cp_addresses = pulumi.Output.all(*[address(m) for m in cp_members])
        secrets = TalosSecrets(f"{name}-secrets", cluster_name=name, endpoints=cp_addresses,
                               renew_before_days=zone.renew_before_days, rotate=zone.rotate, opts=child)
        first_cp = address(cp_members[0])
        self.endpoint = pulumi.Output.from_input(zone.endpoint or pulumi.Output.concat("https://", first_cp, ":6443"))
        # Every node, control planes first (the order rotate-ca patches in): a changed rotation token
        # takes them to the new CA before anything below renders or talks with it.
        ordered = [(m, p.name == zone.control_plane.name) for p in (zone.control_plane, *zone.workers)
                   for m in members[p.name]]
        rotation = CaRotation(
            f"{name}-ca-rotation", cluster_name=name, rotate_tokens=zone.rotate, secrets_yaml=secrets.secretsYaml,
            retiring_yaml=secrets.retiringYaml, talosconfig=secrets.talosconfig,
            nodes=pulumi.Output.all(*[address(m) for m, _ in ordered]).apply(
                lambda addrs: [{"address": a, "controlPlane": cp} for a, (_, cp) in zip(addrs, ordered)]),
            k8s_endpoint=self.endpoint, talos_port=zone.talos_port, timeout=float(t["apply"]),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[instances[m] for m, _ in ordered]))
        secrets_yaml = rotation.secretsYaml
        talosconfig = rotation.talosconfig
        # Machines declared lost leave first (Talos: remove a failed member, then add its
        # replacement): no claim, join or teardown below runs before their members are removed.
        lost = LostMachines(
            f"{name}-lost-machines", zone=name, control_planes=cp_addresses, talosconfig=talosconfig,
            hub_kubeconfig=hub_kubeconfig, talos_port=zone.talos_port, timeout=float(t["teardown"]),
            lost=[{"name": iname[m], "address": lost_address(m), "role": "controlplane" if m.pool == zone.control_plane.name
                   else "worker", "path": f"{zone.path}.talosAddresses[{i}]"}
                  for i, m in enumerate(zone.machines) if m.lost],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[instances[m] for m in zone.machines if m.lost]))
        cp_pool = pool(zone.control_plane, [lost])

        def config_for(pool_name: str) -> tuple[pulumi.Output[str], pulumi.Output[dict]]:
            """The pool's machine config (secret) and its redacted view (not secret: every secret
            in it is masked, so a preview can show a config change path by path)."""

            def render(args) -> tuple[str, dict]:
                # The bundle comes back from our own encrypted state on every run: skip the RSA proof.
                bundle = load_secrets(args[0], check_rsa=False)
                text = machineconfig.render(cluster_spec(name, zone, args[1]), bundle, pool=pool_name).decode()
                return text, config_view.view(text, bundle)

            both = pulumi.Output.all(secrets_yaml, self.endpoint).apply(render)
            return both.apply(lambda b: b[0]), pulumi.Output.unsecret(both.apply(lambda b: b[1]))

        configs = {p.name: config_for(p.name) for p in (zone.control_plane, *zone.workers)}

        def applies(p: Pool, role: str, after: list[pulumi.Resource]) -> list[ConfigApply]:
            config, view = configs[p.name]
            made: list[ConfigApply] = []
            for m in members[p.name]:
                # Control planes one after the other: each joins etcd (and waits for it to be healthy)
                # before the next, and leaves it only after the next one left (deletes run in reverse).
                chain = made[-1:] if role == "controlplane" else []
                made.append(ConfigApply(
                    iname[m],
                    instance=iname[m],
                    pool=p.name,
                    address=address(m),
                    config=config,
                    config_view=view,
                    talosconfig=talosconfig,
                    hub_kubeconfig=hub_kubeconfig,
                    role=role,
                    talos_port=zone.talos_port,
                    apply_timeout=float(t["apply"]),
                    reset_timeout=float(t["teardown"]),
                    leave_etcd_on_delete=role == "controlplane",
                    skip_unreachable=zone.skip_unreachable_cluster,
                    wipe=zone.teardown_wipe,
                    # Its own Instance too: teardown resets the machine before the Instance goes,
                    # whatever else changed in the pool's dependencies in the same run.
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[*after, *chain, instances[m]]),
                ))
            return made

        # The Kubernetes version: its diff refuses, at preview, a skip or a downgrade; on a change it
        # pre-pulls, rolls the new version out node by node and syncs the bootstrap manifests
        # (upgrade-k8s's order) before any ConfigApply sends the full new configs, so no node gets
        # all its new images at once.
        pools = [(zone.control_plane, "controlplane"), *((w, "worker") for w in zone.workers)]
        k8s_version = KubernetesVersion(
            f"{name}-kubernetes-version", zone=name, version=zone.kubernetes_version, config_path=zone.path,
            nodes=[{"name": iname[m], "address": address(m), "role": role, "pool": p.name}
                   for p, role in pools for m in members[p.name]],
            configs={p.name: configs[p.name][0] for p, _ in pools}, talosconfig=talosconfig,
            talos_port=zone.talos_port, timeout=float(t["kubernetesUpgrade"]), opts=child)
        # A config change that needs a reboot rolls here, node by node behind the readiness gate, after
        # the Kubernetes version's image steps and before any ConfigApply (which then applies live only).
        rollout = ConfigRollout(
            f"{name}-config-rollout", zone=name, configs={p.name: configs[p.name][0] for p, _ in pools},
            nodes=[{"name": iname[m], "address": address(m), "role": role, "pool": p.name}
                   for p, role in pools for m in members[p.name]],
            talosconfig=talosconfig, max_unavailable=zone.max_unavailable, drain=zone.upgrade.drain,
            drain_control_planes=zone.upgrade.drain_control_planes, timeout=float(t["apply"]),
            health_timeout=float(t["health"]), talos_port=zone.talos_port,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[k8s_version]))
        cp_applies = applies(zone.control_plane, "controlplane", [cp_pool, rollout])
        bootstrap = Bootstrap(f"{name}-bootstrap", address=first_cp, talosconfig=talosconfig,
                              talos_port=zone.talos_port, timeout=float(t["bootstrap"]),
                              opts=pulumi.ResourceOptions(parent=self, depends_on=cp_applies))
        kubeconfig = Kubeconfig(f"{name}-kubeconfig", address=first_cp, talosconfig=talosconfig,
                                talos_port=zone.talos_port, timeout=float(t["kubeconfig"]),
                                secrets_yaml=secrets_yaml, kubernetes_ca=secrets.kubernetesCa,
                                renew_before_days=zone.renew_before_days,
                                opts=pulumi.ResourceOptions(parent=self, depends_on=[bootstrap]))
        self.kubeconfig = kubeconfig.kubeconfig
        # The cluster is the zone's, whatever CA its kubeconfig trusts: without an identifier a
        # Kubernetes CA rotation (new certificate-authority-data) would replace the provider and
        # with it every object on the cluster.
        self.provider = k8s.Provider(f"{name}-k8s", kubeconfig=kubeconfig.kubeconfig, cluster_identifier=name,
                                     delete_unreachable=zone.skip_unreachable_cluster,
                                     opts=pulumi.ResourceOptions(parent=self))

        # Workers join only after ControlPlaneReady, which waits for Cilium: when Cilium installs,
        # the cluster is its control planes alone. With one, a second operator replica could never
        # schedule (host ports), Cilium never turns healthy and the workers never come.
        cilium_healthy = addons.install_cilium(self, kubeconfig.kubeconfig, single_node=zone.control_plane.replicas == 1)
        # The worker list is the zone's; the check takes those that have joined by then.
        health = ClusterHealth(f"{name}-health", address=first_cp, talosconfig=talosconfig,
                               control_plane_nodes=cp_addresses,
                               worker_nodes=pulumi.Output.all(*[address(m) for w in zone.workers for m in members[w.name]]),
                               talos_port=zone.talos_port, timeout=float(t["health"]),
                               opts=pulumi.ResourceOptions(parent=self, depends_on=[cilium_healthy]))
        self.control_plane_ready = health.healthy
        self.control_plane_ready_resource = health

        worker_applies: list[ConfigApply] = []
        self.worker_pools = {}
        for w in zone.workers:
            wp = pool(w, [health])
            self.worker_pools[w.name] = wp
            worker_applies += applies(w, "worker", [wp, health, rollout])
        cert_manager_healthy = addons.install_cert_manager(self, kubeconfig.kubeconfig, after=[health])
        apply_of = dict(zip([m for p in (zone.control_plane, *zone.workers) for m in members[p.name]],
                            [*cp_applies, *worker_applies]))
        os_versions = self._talos_rollout(zone, members, iname, address, cp_addresses, talosconfig, apply_of, health)

        self.ready = pulumi.Output.all(cert_manager_healthy.healthyPods, *[a.configHash for a in worker_applies],
                                       *os_versions).apply(lambda _: True)
        self.bootstrapped = bootstrap.bootstrapped
        self.talosconfig = talosconfig
        self.secrets_yaml = secrets_yaml
        self.talosconfig_expires = secrets.talosconfigExpires
        self.kubeconfig_expires = kubeconfig.kubeconfigExpires
        self.control_plane_addresses = cp_addresses
        self.members = {p: [iname[m] for m in ms] for p, ms in members.items()}
        # Every current member's address, control planes and workers, sorted: what is derived from
        # membership (a host-network Gateway's addresses, its DNS records) takes it as an input. It
        # resolves once every member's config is applied (their ids: known at a preview unless a
        # machine joins), so a join that fails leaves the Gateway's wait to the next up.
        current = [m for ms in members.values() for m in ms]
        self.member_addresses = pulumi.Output.all(*[address(m) for m in current], *[apply_of[m].id for m in current]
                                                  ).apply(lambda found: sorted({a for a in found[:len(current)] if a}))
        self.addons_ready = [cilium_healthy, cert_manager_healthy]
        self.register_outputs({"endpoint": self.endpoint, "controlPlaneReady": self.control_plane_ready,
                               "ready": self.ready, "members": self.members})

    def _talos_rollout(self, zone: Zone, members: dict, iname: dict, address, cp_addresses, talosconfig,
                       applies: dict, health: pulumi.Resource) -> list[pulumi.Output[str]]:
        """One TalosUpgrade per member, chained: control planes first, then each worker pool, so
        Pulumi upgrades one node at a time and a failed node stops the rest (DESIGN §10)."""
        order = [(zone.control_plane.name, m) for m in members[zone.control_plane.name]]
        order += [(w.name, m) for w in zone.workers for m in members[w.name]]
        t, up = zone.timeouts, zone.upgrade
        previous: list[pulumi.Resource] = [health]
        versions = []
        for i, (pool_name, m) in enumerate(order, 1):
            cp = pool_name == zone.control_plane.name
            step = TalosUpgrade(
                f"{iname[m]}-os", instance=iname[m], address=address(m), role="controlplane" if cp else "worker",
                pool=pool_name, talos_version=zone.talos_version, installer_image=up.image(zone.talos_version),
                control_planes=cp_addresses, talosconfig=talosconfig,
                drain=up.drain_control_planes if cp else up.drain, allow_downgrade=up.allow_downgrade,
                timeout=float(t["upgrade"]), health_timeout=float(t["health"]), config_path=zone.path,
                step=f"{i}/{len(order)} ({pool_name})", talos_port=zone.talos_port,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*previous, applies[m]]))
            previous = [step]
            versions.append(step.version)
        return versions

    def on_cluster(self, depends_on=None) -> pulumi.ResourceOptions:
        return on_zone_cluster(self, self.provider, self.zone, depends_on)


def pool_members(zone: Zone, pool: Pool) -> list[Machine]:
    """The first `replicas` machines listed for the pool (in talosAddresses order) that are not
    marked lost; the rest are spares. Adding machines at the end never displaces a member, and
    marking one lost makes the first spare its replacement."""
    return [m for m in zone.machines if m.pool == pool.name and not m.lost][: pool.replicas]


def on_zone_cluster(parent: pulumi.Resource, provider: k8s.Provider, zone: Zone,
                    depends_on=None) -> pulumi.ResourceOptions:
    """Options of every object on a zone's cluster. With the escape hatch
    (teardown.skipUnreachableCluster) they are retained on delete: teardown drops them from the
    state without calling the dead API server; the node resets wipe them anyway."""
    return pulumi.ResourceOptions(parent=parent, provider=provider, depends_on=depends_on,
                                  retain_on_delete=zone.skip_unreachable_cluster)
