"""FluxInstance: the zone's FluxInstance `flux`, applied and waited for (bounded) until Ready.

Create/update server-side apply the manifest and block until the operator reports Ready for
it, naming the failing condition (and the operator pod's state, e.g. the seed's ClusterIP
timeout) past the bound. `revision` ties it to the operator release, so a changed release
re-runs it, like the seed's bootstrap Job on changed values. Delete lets the operator's
finalizer uninstall Flux, bounded: a zone whose operator is gone does not hang teardown.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs, with_secret_outputs

UPDATE_ON = ("manifest", "revision", "kubeconfig")


class FluxInstanceProvider(ResourceProvider):
    def check(self, _olds, news):
        failures = [] if news.get("kubeconfig") else [CheckFailure("kubeconfig", "required (secret)")]
        return CheckResult(news, failures)

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=UPDATE_ON)

    def _apply(self, props: dict) -> dict:
        from kontinuum.kube import flux  # only where a call runs (kubernetes client)

        revision = flux.apply_instance(props["kubeconfig"], props["manifest"], timeout=float(props["timeout"]))
        return {**props, "appliedRevision": revision, "ready": True}

    def create(self, props):
        md = props["manifest"]["metadata"]
        return CreateResult(id_=f"{md['namespace']}/{md['name']}", outs=self._apply(props))

    def update(self, _id, _olds, news):
        return UpdateResult(outs=self._apply(news))

    def delete(self, _id, props):
        from kontinuum.kube import flux

        note = flux.delete_instance(props["kubeconfig"], props["manifest"]["metadata"]["namespace"],
                                    timeout=float(props["timeout"]))
        if "finalizer was removed" in note:
            pulumi.log.warn(note)


class FluxInstance(TypedResource, module="flux", name="FluxInstance"):
    ready: pulumi.Output[bool]
    appliedRevision: pulumi.Output[str]

    def __init__(self, resource_name: str, *, kubeconfig: pulumi.Input[str], manifest: dict, timeout: float,
                 revision: pulumi.Input = None, opts: pulumi.ResourceOptions | None = None):
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "manifest": manifest, "timeout": timeout,
                 "revision": revision, "ready": None, "appliedRevision": None}
        super().__init__(FluxInstanceProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
