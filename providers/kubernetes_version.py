"""KubernetesVersion: the zone's Kubernetes version as last rolled out, recorded so that
preview can refuse a change upgrade-k8s would refuse (one minor at a time, never back) before
any node gets a new machine config. Pure: no I/O anywhere; the zone's ConfigApply resources
depend on it, so a refused diff stops the run before them.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from kontinuum.errors import ConfigError
from kontinuum.lifecycle import versions
from providers.common import TypedResource
from providers.talos_common import Inputs, known


def diff_kubernetes_version(olds: dict, news: dict) -> DiffResult:
    recorded, target = olds.get("version"), news.get("version")
    if not known(target) or not recorded:
        return DiffResult(changes=True)
    if versions.same(recorded, target):
        return DiffResult(changes=olds.get("configPath") != news.get("configPath"))
    if (problem := versions.kubernetes_skew_problem(recorded, target)):
        raise ConfigError(f"{news.get('configPath') or 'zones[?]'}.kubernetesVersion",
                          f"the zone runs Kubernetes {recorded}: {problem}. Nothing was changed")
    return DiffResult(changes=True)


class KubernetesVersionProvider(ResourceProvider):
    def check(self, olds, news):
        inputs = Inputs(news)
        inputs.string("version", "the zone's Kubernetes version")
        return inputs.result()

    def diff(self, _id, olds, news):
        return diff_kubernetes_version(olds, news)

    def create(self, props):
        return CreateResult(id_=props.get("zone") or "kubernetes", outs=dict(props))

    def update(self, _id, olds, news):
        return UpdateResult(outs=dict(news))


class KubernetesVersion(TypedResource, module="talos", name="KubernetesVersion"):
    version: pulumi.Output[str]

    def __init__(self, resource_name: str, *, zone: str, version: str, config_path: str,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(KubernetesVersionProvider(), resource_name,
                         {"zone": zone, "version": version, "configPath": config_path}, opts)
