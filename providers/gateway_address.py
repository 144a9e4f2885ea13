"""GatewayAddress: a wait resource whose create blocks (bounded) until the zone's Gateway is
reachable, and whose output is its address(es): the gate before DNS and the Certificate wait,
so a Gateway nobody gives an address fails fast, naming the ingress setting to check.

check/diff are pure; the wait is kontinuum.kube.gateways. `trigger` ties it to the Gateway
resource (uid/generation) and the exposure settings, so a changed Gateway or mode waits again.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, cluster_wait_failures, diff_inputs, with_secret_outputs

UPDATE_ON = ("namespace", "name", "mode", "nodeSelector", "pool", "fixed", "trigger", "kubeconfig")
MODES = ("hostNetwork", "loadBalancer")


class GatewayAddressProvider(ResourceProvider):
    def check(self, _olds, news):
        failures = cluster_wait_failures(news, "namespace", "name", "setting")
        if news.get("mode") not in MODES:
            failures.append(CheckFailure("mode", f"must be one of {', '.join(MODES)}, got {news.get('mode')!r}"))
        return CheckResult(news, failures)

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=UPDATE_ON)

    def _wait(self, props: dict) -> dict:
        from kontinuum.kube.gateways import wait_addresses

        found = wait_addresses(props["kubeconfig"], props["namespace"], props["name"], mode=props["mode"],
                               setting=props["setting"], timeout=float(props["timeout"]),
                               node_selector=props.get("nodeSelector") or {}, pool=bool(props.get("pool")),
                               fixed=props.get("fixed") or None)
        return {**props, "addresses": found}

    def create(self, props):
        return CreateResult(id_=f"{props['namespace']}/{props['name']}", outs=self._wait(props))

    def update(self, _id, _olds, news):
        return UpdateResult(outs=self._wait(news))


class GatewayAddress(TypedResource, module="kube", name="GatewayAddress"):
    """Outputs: addresses (the Gateway's reachable IPs, sorted as Cilium or the nodes report them)."""

    addresses: pulumi.Output[list]

    def __init__(self, resource_name: str, *, kubeconfig: pulumi.Input[str], namespace: str, name: str, mode: str,
                 setting: str, timeout: float, node_selector: dict | None = None, pool: bool = False,
                 fixed: str | None = None, trigger: pulumi.Input = None, opts: pulumi.ResourceOptions | None = None):
        """setting: the stack-config path of the zone's ingress (`zones[0].ingress`), named on failure."""
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "namespace": namespace, "name": name, "mode": mode,
                 "setting": setting, "timeout": timeout, "nodeSelector": dict(node_selector or {}), "pool": pool,
                 "fixed": fixed, "trigger": trigger, "addresses": None}
        super().__init__(GatewayAddressProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
