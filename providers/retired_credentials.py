"""RetiredCredentials: deletes credential Secrets this stack does not manage (seed 002: the
old Gitea deploy key left by an earlier bootstrap) once they are listed in
`flux.retiredCredentials`; only those, in the operator's namespace, and only after Flux has run
from the zone's current source without problems (seed 002's order: the sync's source object
reads that URL and its Kustomization applied the fetched revision; kontinuum/kube/flux_sync.py).
Until then nothing is deleted and the error says what the sync still lacks. Reading the truth
first makes it idempotent: an already deleted Secret is no error, and nothing is recreated."""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CreateResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, diff_inputs, with_secret_outputs


class RetiredCredentialsProvider(ResourceProvider):
    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=("names", "namespace", "kubeconfig", "sourceUrl"))

    def _retire(self, props: dict) -> dict:
        from kontinuum.kube import flux, flux_sync

        try:
            proven = flux_sync.wait_proven(props["kubeconfig"], props["namespace"], props["sourceKind"],
                                           props["sourceUrl"], timeout=float(props["timeout"]))
        except flux_sync.SyncNotProven as e:
            raise flux_sync.SyncNotProven(
                f"{', '.join(props['names'])} not retired yet: {e}. The old credentials stay until the new source is "
                "proven; fix what is named (source URL, credential, the Git server), then run `pulumi up` again.") from None
        deleted = flux.retire_secrets(props["kubeconfig"], props["namespace"], list(props["names"]))
        return {**props, "deleted": deleted, "provenRevision": proven}

    def create(self, props):
        return CreateResult(id_=f"{props['namespace']}/retired", outs=self._retire(props))

    def update(self, _id, _olds, news):
        return UpdateResult(outs=self._retire(news))


class RetiredCredentials(TypedResource, module="flux", name="RetiredCredentials"):
    deleted: pulumi.Output[list]
    provenRevision: pulumi.Output[str]

    def __init__(self, resource_name: str, *, kubeconfig: pulumi.Input[str], namespace: str, names: list[str],
                 source_kind: str, source_url: str, timeout: float, opts: pulumi.ResourceOptions | None = None):
        """source_kind/source_url: the source the zone syncs from now (the FluxInstance's)."""
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "namespace": namespace, "names": sorted(names),
                 "sourceKind": source_kind, "sourceUrl": source_url, "timeout": timeout, "deleted": None,
                 "provenRevision": None}
        super().__init__(RetiredCredentialsProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
