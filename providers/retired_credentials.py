"""RetiredCredentials: deletes credential Secrets this stack does not manage (seed 002: the
old Gitea deploy key left by an earlier bootstrap) once they are listed in
`flux.retiredCredentials`; only those, in the operator's namespace. Reading the truth first
makes it idempotent: an already deleted Secret is no error, and nothing is recreated."""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CreateResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs, with_secret_outputs


class RetiredCredentialsProvider(ResourceProvider):
    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=("names", "namespace", "kubeconfig"))

    def _retire(self, props: dict) -> dict:
        from kontinuum.kube import flux

        deleted = flux.retire_secrets(props["kubeconfig"], props["namespace"], list(props["names"]))
        return {**props, "deleted": deleted}

    def create(self, props):
        return CreateResult(id_=f"{props['namespace']}/retired", outs=self._retire(props))

    def update(self, _id, _olds, news):
        return UpdateResult(outs=self._retire(news))


class RetiredCredentials(TypedResource, module="flux", name="RetiredCredentials"):
    deleted: pulumi.Output[list]

    def __init__(self, resource_name: str, *, kubeconfig: pulumi.Input[str], namespace: str, names: list[str],
                 opts: pulumi.ResourceOptions | None = None):
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "namespace": namespace, "names": sorted(names),
                 "deleted": None}
        super().__init__(RetiredCredentialsProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
