"""TeardownGuard: before anything on a zone cluster is deleted, make sure its API server answers.

It depends on every object of the zone cluster, so teardown deletes it first. Its delete probes
the API server (bounded); when nothing answers it fails with the way out, instead of each
Kubernetes object failing on its own with a message that does not say what to do. Create and
update contact nothing. With the escape hatch the guard, like every object on the cluster, is
retained on delete, so it never runs.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ResourceProvider, UpdateResult

from kontinuum.errors import KontinuumError
from kontinuum.talos.waits import NotYet, WaitTimeout, wait_until
from providers.common import TypedResource, diff_inputs, with_secret_outputs

UPDATE_ON = ("kubeconfig", "zone", "timeout", "skipUnreachable", "remedy")
PROBE_TIMEOUT = 5.0  # seconds for one request


class ZoneClusterUnreachable(KontinuumError):
    """The zone cluster's API server did not answer, so its objects cannot be deleted."""


def check_guard(news: dict) -> list[CheckFailure]:
    failures = [] if news.get("kubeconfig") else [CheckFailure("kubeconfig", "required: the zone's kubeconfig")]
    for key in ("zone", "remedy"):
        if not news.get(key):
            failures.append(CheckFailure(key, "required"))
    timeout = news.get("timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        failures.append(CheckFailure("timeout", f"must be a number of seconds > 0, got {timeout!r}"))
    return failures


def ensure_reachable(props: dict, *, probe=None, **wait) -> None:
    if props.get("skipUnreachable"):
        return
    from kontinuum.kube.clients import probe_api_server, server_of  # only at teardown (kubernetes client)

    probe = probe or probe_api_server
    kubeconfig = props["kubeconfig"]

    def answers(left: float) -> None:
        problem = probe(kubeconfig, min(left, PROBE_TIMEOUT))
        if problem:
            raise NotYet(problem)

    try:
        wait_until(f"the API server of zone {props['zone']} to answer", answers, timeout=float(props["timeout"]),
                   remedy="", **wait)
    except WaitTimeout as exc:
        raise ZoneClusterUnreachable(
            f"zone {props['zone']}: its cluster's API server {server_of(kubeconfig)} did not answer within "
            f"{exc.bound:g} s ({exc.last}), so the objects on it cannot be deleted. If the cluster is only down, "
            f"bring it back and run again. If it is gone for good, {props['remedy']}"
        ) from None


class TeardownGuardProvider(ResourceProvider):
    def check(self, _olds, news):
        return CheckResult(news, check_guard(news))

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=UPDATE_ON)

    def create(self, props):
        return CreateResult(id_=props["zone"], outs=props)

    def update(self, _id, _olds, news):
        return UpdateResult(outs=news)

    def delete(self, _id, props):
        ensure_reachable(props)


class TeardownGuard(TypedResource, module="kube", name="TeardownGuard"):
    def __init__(self, resource_name: str, *, kubeconfig: pulumi.Input[str], zone: str, timeout: float,
                 skip_unreachable: bool, remedy: str, opts: pulumi.ResourceOptions | None = None):
        """remedy: what to do when the cluster is gone for good (names the stack config key)."""
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "zone": zone, "timeout": timeout,
                 "skipUnreachable": skip_unreachable, "remedy": remedy}
        super().__init__(TeardownGuardProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
