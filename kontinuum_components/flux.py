"""FluxHandOff: the zone handed to Flux (seed 002; DESIGN §4 "Flux (optional)").

Namespace → Flux Operator release (right after Cilium's release, not after its health gate:
the operator runs on the host network and reaches the API through KubePrism, so it needs no
pod network) → the credential Secrets → FluxInstance `flux`, waited for until Ready → the
retirement of unmanaged credentials, once the sync has applied a revision from the current
source (seed 002's order). Only wiring: manifests come from kontinuum.kube.flux.

Removing `flux` from a zone deletes them in reverse: the FluxInstance first (the running
operator's finalizer uninstalls Flux), then the Secrets, the release and the namespace; with
`handOver` (Git owns Flux) every one of them is retained instead, and Flux keeps running.
"""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from kontinuum.kube import flux_manifests as kflux
from kontinuum.stackconfig.flux import Flux
from providers.flux_instance import FluxInstance
from providers.retired_credentials import RetiredCredentials

RELEASE = "flux-operator"


def instance_manifest(f: Flux) -> dict:
    src = f.active
    return kflux.instance_manifest(
        namespace=f.namespace, version=f.version, registry=f.registry, components=list(f.components),
        kind=src.kind, url=src.url, ref=src.ref, path=src.path, interval=f.interval, pull_secret=src.credential,
        suspend_apps=f.suspend_apps, apps=list(f.apps))


def credential_manifests(f: Flux) -> list[dict]:
    """One Secret per credential, shaped for the source that uses it (OCI: a docker config)."""
    urls = {s.credential: s.url for s in (f.source, f.fallback) if s is not None and s.credential}
    return [kflux.credential_secret(name=c.name, namespace=f.namespace, source_url=urls.get(c.name),
                                    ssh_private_key=c.ssh_private_key, known_hosts=c.known_hosts,
                                    username=c.username, token=c.token) for c in f.credentials]


def release_args(f: Flux) -> dict:
    chart = f.chart
    args = dict(name=RELEASE, namespace=f.namespace, create_namespace=False, values=kflux.operator_values(),
                skip_await=True, timeout=300)
    if chart.get("path"):
        args["chart"] = str(Path(chart["path"]).resolve())
    else:
        args.update(chart=f"{chart['repo'].rstrip('/')}/{chart['chart']}", version=chart.get("version"))
    return args


def handover_note(f: Flux) -> str:
    """What stays in the cluster when a handed-over zone drops `flux` (seed 002's run-once mode)."""
    kept = [f"namespace {f.namespace}", f"Helm release {f.namespace}/{RELEASE}", f"FluxInstance {f.namespace}/flux",
            *(f"Secret {f.namespace}/{c.name}" for c in f.credentials)]
    return ("flux.handOver: Git owns Flux after its bootstrap; this stack no longer changes the FluxInstance. "
            f"Removing `flux` from the zone forgets these and leaves them running: {', '.join(kept)}.")


class FluxHandOff(pulumi.ComponentResource):
    def __init__(self, name: str, *, cluster, flux: Flux, kubeconfig: pulumi.Input[str], after: list,
                 timeout: float, opts: pulumi.ResourceOptions | None = None):
        """cluster: the zone's TalosCluster (its provider and on_cluster options); after: what
        the operator waits for (Cilium's Helm release, not its health gate)."""
        super().__init__("kontinuum:index:FluxHandOff", name, None, opts)

        def on_cluster(depends_on=None) -> pulumi.ResourceOptions:
            # handOver: Git owns Flux; dropping `flux` later forgets these records, deletes nothing.
            return pulumi.ResourceOptions.merge(cluster.on_cluster(depends_on), pulumi.ResourceOptions(
                parent=self, retain_on_delete=flux.hand_over or None))

        # No labels of ours: the operator's distribution labels this namespace (managed-by
        # flux-operator), and two owners of one label fail every apply after a refresh.
        ns = k8s.core.v1.Namespace(f"{name}-flux-namespace", metadata={"name": flux.namespace},
                                   opts=on_cluster(after))
        release = k8s.helm.v3.Release(f"{name}-flux-operator", k8s.helm.v3.ReleaseArgs(**release_args(flux)),
                                      opts=on_cluster([ns]))
        secrets = []
        for manifest in credential_manifests(flux):
            md = manifest["metadata"]
            secrets.append(k8s.core.v1.Secret(
                f"{name}-flux-credential-{md['name']}", metadata=md, type=manifest["type"],
                string_data=pulumi.Output.secret(manifest["stringData"]), opts=on_cluster([ns])))
        instance = FluxInstance(f"{name}-flux-instance", kubeconfig=kubeconfig, manifest=instance_manifest(flux),
                                timeout=timeout, revision=release.status.revision, hand_over=flux.hand_over,
                                opts=on_cluster([release, *secrets]))
        if flux.hand_over:
            pulumi.log.info(handover_note(flux), resource=self)
        if flux.retired:  # seed 002: only once Flux has run from the current source
            RetiredCredentials(f"{name}-flux-retired-credentials", kubeconfig=kubeconfig, namespace=flux.namespace,
                               names=list(flux.retired), source_kind=flux.active.kind, source_url=flux.active.url,
                               timeout=timeout, opts=on_cluster([instance]))
        self.ready = instance.ready
        self.revision = instance.appliedRevision
        self.register_outputs({"ready": self.ready})
