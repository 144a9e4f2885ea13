"""PodsHealthy: a wait resource whose create blocks (bounded) until an addon's pods are healthy.

The Helm release itself is non-blocking (seeds: "Pod health is probed separately from the
Helm apply"); this resource is the gate. `revision` ties it to the release, so a new release
revision waits again.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs, with_secret_outputs

UPDATE_ON = ("namespace", "selector", "minPods", "revision", "kubeconfig")


class PodsHealthyProvider(ResourceProvider):
    def check(self, _olds, news):
        failures = [] if news.get("namespace") else [CheckFailure("namespace", "required")]
        if not news.get("kubeconfig"):
            failures.append(CheckFailure("kubeconfig", "required (secret)"))
        return CheckResult(news, failures)

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=UPDATE_ON)

    def _wait(self, props: dict) -> dict:
        from kontinuum.kube.pods import wait_healthy  # only where a wait runs (kubernetes client)

        count = wait_healthy(props["kubeconfig"], props["namespace"], selector=props.get("selector") or "",
                             min_pods=int(props.get("minPods") or 1), timeout=float(props["timeout"]),
                             what=props.get("what") or props["namespace"])
        return {**props, "healthyPods": count}

    def create(self, props):
        return CreateResult(id_=f"{props['namespace']}/{props.get('selector') or '*'}", outs=self._wait(props))

    def update(self, _id, _olds, news):
        return UpdateResult(outs=self._wait(news))


class PodsHealthy(TypedResource, module="kube", name="PodsHealthy"):
    healthyPods: pulumi.Output[int]

    def __init__(self, resource_name: str, *, kubeconfig: pulumi.Input[str], namespace: str, what: str,
                 timeout: float, selector: str = "", min_pods: int = 1, revision: pulumi.Input = None,
                 opts: pulumi.ResourceOptions | None = None):
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "namespace": namespace, "selector": selector,
                 "minPods": min_pods, "timeout": timeout, "what": what, "revision": revision, "healthyPods": None}
        super().__init__(PodsHealthyProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
