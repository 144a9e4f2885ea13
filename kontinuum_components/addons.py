"""The built-in addons: Gateway API CRDs, Cilium before the health gate, cert-manager after.

Helm releases are non-blocking (skipAwait); a PodsHealthy wait is the gate behind each, as in
the seeds. Values follow Talos's Cilium guide (config facts §4); stack config may add values
and point the charts elsewhere (the lab uses its own charts).
"""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from kontinuum.kube.manifests import ManifestError
from kontinuum.stackconfig import specs
from kontinuum.stackconfig.exposure import Ingress
from kontinuum.stackconfig.model import Addon
from kontinuum_components import exposure
from providers.pods_healthy import PodsHealthy

CILIUM_AGENT_CAPABILITIES = ["CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_ADMIN", "SYS_RESOURCE",
                             "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"]
CILIUM_CLEAN_STATE_CAPABILITIES = ["NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"]


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def cilium_values(*, single_node: bool, extra: dict, ingress: Ingress | None = None) -> dict:
    """Talos-guide values: kube-proxy-free through KubePrism on localhost:7445, plus what makes the
    zone's Gateway reachable (exposure.cilium_values: host network or LB-IPAM + L2)."""
    values = {
        "ipam": {"mode": "kubernetes"},
        "kubeProxyReplacement": True,
        "securityContext": {"capabilities": {"ciliumAgent": CILIUM_AGENT_CAPABILITIES,
                                             "cleanCiliumState": CILIUM_CLEAN_STATE_CAPABILITIES}},
        "cgroup": {"autoMount": {"enabled": False}, "hostRoot": "/sys/fs/cgroup"},
        "k8sServiceHost": "localhost",
        "k8sServicePort": 7445,
        "gatewayAPI": {"enabled": True, "enableAlpn": True, "enableAppProtocol": True},
    }
    if single_node:
        # The operator runs on hostNetwork with required anti-affinity: a second replica
        # can never schedule on one node (seeds, "cilium-operator runs a single replica").
        values["operator"] = {"replicas": 1}
    values = deep_merge(values, exposure.cilium_values(ingress or Ingress(), extra, CILIUM_AGENT_CAPABILITIES))
    return deep_merge(values, extra)


# cert-manager retries a failed challenge self check after this period (acmeDNS01Config, used for
# HTTP-01 too). Upstream's 10 s suits DNS propagation; our only solver is HTTP-01 through the
# zone's own Gateway, whose first check usually comes before the solver's route is attached.
SELF_CHECK_RETRY = "2s"


def cert_manager_values(extra: dict) -> dict:
    return deep_merge({"crds": {"enabled": True}, "config": {
        "apiVersion": "controller.config.cert-manager.io/v1alpha1", "kind": "ControllerConfiguration",
        "enableGatewayAPI": True, "acmeDNS01Config": {"checkRetryPeriod": SELF_CHECK_RETRY}}}, extra)


def _release(cluster, name: str, addon: Addon, values: dict, depends_on: list) -> k8s.helm.v3.Release:
    src = addon.source
    args = dict(
        name=name,
        namespace=src.namespace,
        create_namespace=True,
        values=values,
        skip_await=True,
        timeout=300,
    )
    if src.path:
        args["chart"] = str(Path(src.path).resolve())
    else:
        args.update(chart=src.chart, version=src.version, repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=src.repo))
    return k8s.helm.v3.Release(f"{cluster.name}-{name}", k8s.helm.v3.ReleaseArgs(**args),
                               opts=cluster.on_cluster(depends_on))


def gateway_api_crds(cluster) -> list[pulumi.Resource]:
    """One resource per object of the bundle, parsed here: preview and teardown never need
    the zone's API server for them (a provider-side YAML group would load its schema)."""
    try:
        objects = specs.gateway_api_objects(cluster.zone.addons.gateway_api)
    except ManifestError as e:
        raise pulumi.RunError(f"zone {cluster.name}: addons.gatewayApi.source: {e}") from None
    opts = cluster.on_cluster()
    out: list[pulumi.Resource] = []
    for obj in objects:
        name = f"{cluster.name}-gateway-api-{obj['metadata']['name']}"
        if obj["kind"] == "CustomResourceDefinition" and obj["apiVersion"] == "apiextensions.k8s.io/v1":
            out.append(k8s.apiextensions.v1.CustomResourceDefinition(
                name, metadata=obj["metadata"], spec=obj["spec"], opts=opts))
        else:
            rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            out.append(k8s.apiextensions.CustomResource(
                f"{name}-{obj['kind'].lower()}", api_version=obj["apiVersion"], kind=obj["kind"],
                metadata=obj["metadata"], opts=opts, **rest))
    return out


def install_cilium(cluster, kubeconfig: pulumi.Output[str], *, single_node: bool) -> PodsHealthy:
    crds = gateway_api_crds(cluster)
    addon = cluster.zone.addons.cilium
    values = cilium_values(single_node=single_node, extra=addon.values, ingress=cluster.zone.ingress)
    release = _release(cluster, "cilium", addon, values, crds)
    cluster.cilium_release = release  # what the Flux Operator waits for (not the health gate)
    return PodsHealthy(f"{cluster.name}-cilium-healthy", kubeconfig=kubeconfig, namespace=addon.source.namespace,
                       selector="app.kubernetes.io/part-of=cilium", what="Cilium",
                       timeout=float(cluster.zone.timeouts["cilium"]), revision=release.status.revision,
                       opts=pulumi.ResourceOptions(parent=cluster, depends_on=[release]))


def install_cert_manager(cluster, kubeconfig: pulumi.Output[str], *, after: list) -> PodsHealthy:
    addon = cluster.zone.addons.cert_manager
    release = _release(cluster, "cert-manager", addon, cert_manager_values(addon.values), after)
    return PodsHealthy(f"{cluster.name}-cert-manager-healthy", kubeconfig=kubeconfig,
                       namespace=addon.source.namespace, what="cert-manager",
                       timeout=float(cluster.zone.timeouts["certManager"]), revision=release.status.revision,
                       opts=pulumi.ResourceOptions(parent=cluster, depends_on=[release]))
