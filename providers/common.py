"""What every dynamic provider here shares: pure diffs and secret-output options.

Providers stay stateless and credential-free (DESIGN §3): Pulumi pickles the provider object
into the state, so credentials travel only as secret inputs and come back as secret outputs.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, DiffResult, Resource, ResourceProvider

# What every dynamic resource was called before each got its own type: stacks made then keep
# their resources through this alias (no replace, no new machine step).
LEGACY_TYPE = "pulumi-python:dynamic:Resource"


class TypedResource(Resource):
    """A dynamic resource with a readable type (`pulumi-python:dynamic/<module>:<Name>`, given as
    `class X(TypedResource, module=…, name=…)`), aliased to the type it had before."""

    def __init__(self, provider: ResourceProvider, name: str, props: dict,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        legacy = pulumi.ResourceOptions(aliases=[pulumi.Alias(type_=LEGACY_TYPE)])
        super().__init__(provider, name, props, pulumi.ResourceOptions.merge(opts, legacy))


def diff_inputs(olds: dict, news: dict, *, replace_on=(), update_on=()) -> DiffResult:
    """Pure diff over named inputs; replacements delete first (identities never coexist)."""
    changed = [k for k in (*replace_on, *update_on) if olds.get(k) != news.get(k)]
    return DiffResult(changes=bool(changed), replaces=[k for k in changed if k in replace_on],
                      delete_before_replace=True)


def why_not_read(exc: BaseException) -> str:
    """One line on why a refresh could not read something; the error's own text only when it is
    ours (an API client's may quote a response body)."""
    from kontinuum.errors import KontinuumError

    if isinstance(exc, KontinuumError):
        return str(exc).splitlines()[0][:300]
    status = getattr(exc, "status", None)
    return f"{exc.__class__.__name__}" + (f" (HTTP {status})" if status else "")


def with_secret_outputs(opts: pulumi.ResourceOptions | None, *names: str) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=list(names)))


def cluster_wait_failures(news: dict, *required: str, kubeconfig: str = "kubeconfig",
                          whose: str = "the zone cluster's") -> list[CheckFailure]:
    """Check failures shared by the waits on a cluster (a zone's, or the hub's): the named keys
    required, the cluster's kubeconfig (input `kubeconfig`) present, the timeout a number of
    seconds >= 0."""
    failures = [CheckFailure(k, "required") for k in required if not news.get(k)]
    if not news.get(kubeconfig):
        failures.append(CheckFailure(kubeconfig, f"required: {whose} kubeconfig (secret)"))
    timeout = news.get("timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        failures.append(CheckFailure("timeout", f"must be a number of seconds >= 0, got {timeout!r}"))
    return failures
