"""CertificateReady: a wait resource whose create blocks (bounded) until a cert-manager
Certificate reports Ready=True (seeds: Installed flips only once the Certificate is Ready, "a
real signal that TLS issuance actually succeeded, not just that the object was created").

check/diff are pure, so `pulumi preview` contacts nothing. `trigger` ties the wait to the
Certificate resource (its uid and generation), so a replaced or edited Certificate waits
again. The wait itself is kontinuum.kube.certificates, imported when a wait runs: the program
that registers this resource never needs the kubernetes client.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckResult, CreateResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, cluster_wait_failures, diff_inputs, with_secret_outputs

UPDATE_ON = ("namespace", "name", "trigger", "kubeconfig")


# -- provider -------------------------------------------------------------------------------


class CertificateReadyProvider(ResourceProvider):
    def check(self, _olds, news):
        return CheckResult(news, cluster_wait_failures(news, "namespace", "name"))

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=UPDATE_ON)

    def _wait(self, props: dict) -> dict:
        from kontinuum.kube.certificates import ready_condition, wait_ready

        cert = wait_ready(props["kubeconfig"], props["namespace"], props["name"], timeout=float(props["timeout"]),
                          gateway=props.get("gateway") or None)
        status = cert.get("status") or {}
        return {**props, "ready": True, "notAfter": status.get("notAfter"),
                "message": ready_condition(cert).get("message")}

    def create(self, props):
        return CreateResult(id_=f"{props['namespace']}/{props['name']}", outs=self._wait(props))

    def update(self, _id, _olds, news):
        return UpdateResult(outs=self._wait(news))


class CertificateReady(TypedResource, module="kube", name="CertificateReady"):
    """Outputs: ready (true), notAfter, message (the Ready condition's)."""

    ready: pulumi.Output[bool]
    notAfter: pulumi.Output[str]
    message: pulumi.Output[str]

    def __init__(self, resource_name: str, *, kubeconfig: pulumi.Input[str], namespace: str, name: str,
                 timeout: float, gateway: str | None = None, trigger: pulumi.Input = None,
                 opts: pulumi.ResourceOptions | None = None):
        """gateway: `namespace/name` of the Gateway serving the Certificate, for the timeout message."""
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "namespace": namespace, "name": name,
                 "timeout": timeout, "gateway": gateway, "trigger": trigger,
                 "ready": None, "notAfter": None, "message": None}
        super().__init__(CertificateReadyProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
