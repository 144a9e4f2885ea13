"""FluxInstance: the zone's FluxInstance `flux`, applied and waited for (bounded) until Ready.

Create/update server-side apply the manifest and block until the operator reports Ready for
it, naming the failing condition (and the operator pod's state, e.g. the seed's ClusterIP
timeout) past the bound. `revision` ties it to the operator release, so a changed release
re-runs it, like the seed's bootstrap Job on changed values. Delete lets the operator's
finalizer uninstall Flux, bounded: a zone whose operator is gone does not hang teardown.
Read (refresh, the drift job) compares the live object's fields that we set with ours: a
FluxInstance that Git or a person changed is drift, one that is gone is recreated by the next
up. With `handOver` Git owns it after the bootstrap: nothing is drift.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs, why_not_read, with_secret_outputs

UPDATE_ON = ("manifest", "revision", "kubeconfig", "handOver")


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

    def read(self, id_, props):
        from kontinuum.kube import flux, flux_manifests
        from providers.talos_common import warn

        if props.get("handOver"):
            return ReadResult(id_=id_, outs=props)
        ours = props["manifest"]
        try:
            live = flux.read_instance(props["kubeconfig"], ours["metadata"]["namespace"])
        except Exception as exc:  # noqa: BLE001 - any failure to read is reported, never fatal
            warn(f"FluxInstance {id_}: not read ({why_not_read(exc)}); kept as recorded")
            return ReadResult(id_=id_, outs=props)
        if live is None:
            warn(f"FluxInstance {id_}: drift: it is gone; the next `pulumi up` applies it again")
            return ReadResult(id_=None, outs={})
        view = flux_manifests.instance_view(ours, live)
        if view != ours:
            warn(f"FluxInstance {id_}: drift: changed outside this stack; the next `pulumi up` applies ours again")
        return ReadResult(id_=id_, outs={**props, "manifest": view})

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
                 revision: pulumi.Input = None, hand_over: bool = False, opts: pulumi.ResourceOptions | None = None):
        """hand_over: Git owns it once Ready (no updates, no drift; kept when the zone drops `flux`)."""
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "manifest": manifest, "timeout": timeout,
                 "revision": revision, "handOver": hand_over, "ready": None, "appliedRevision": None}
        if hand_over:
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(ignore_changes=["manifest", "revision"]))
        super().__init__(FluxInstanceProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
