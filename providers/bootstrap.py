"""Bootstrap: start etcd on one control-plane node, exactly once per cluster.

create calls Bootstrap over mTLS, retried within `timeout` while the node is still coming
up; "already bootstrapped" (a re-run, or another run got there first) is success. Nothing
ever calls it again: a changed node or talosconfig is only recorded (a second Bootstrap on
a control plane that has not joined etcd yet would start a second, split etcd cluster).
delete does nothing: the cluster's etcd goes away when its members are reset.
"""

from __future__ import annotations

import pulumi
from grpclib.const import Status
from pulumi.dynamic import CreateResult, ReadResult, ResourceProvider, UpdateResult

from kontinuum.talos.errors import AlreadyBootstrappedError, TalosError
from kontinuum.talos.talosconfig import APID_PORT
from kontinuum.talos.waits import WAIT_DEFAULTS, NotYet, wait_until
from providers.common import TypedResource, diff_inputs, with_secret_outputs
from providers.talos_common import TRANSIENT, Inputs, info, node_client, warn

READ_TIMEOUT = 10.0  # seconds to read etcd membership on refresh

UPDATE_ON = ("address", "talosPort", "talosconfig", "timeout")


def check_bootstrap(news: dict) -> Inputs:
    inputs = Inputs(news)
    inputs.string("address", "the address of the control-plane node to bootstrap")
    inputs.port()
    inputs.talosconfig()
    inputs.seconds("timeout", WAIT_DEFAULTS.bootstrap)
    return inputs


def bootstrap_once(props: dict) -> None:
    client = node_client(props)
    address = props["address"]

    def attempt(left: float) -> None:
        try:
            client.bootstrap(timeout=min(left, client.deadlines.bootstrap))
            info(f"{address}: bootstrapped etcd")
        except AlreadyBootstrappedError as exc:
            info(f"{address}: already bootstrapped ({exc.problem}); nothing to do")
        except TRANSIENT as exc:
            raise NotYet(exc.problem) from exc
        except TalosError as exc:
            if exc.status is not Status.FAILED_PRECONDITION:  # e.g. still booting: retry
                raise
            raise NotYet(exc.problem) from exc

    wait_until(
        f"Bootstrap {address}: the control-plane node to accept Bootstrap",
        attempt,
        timeout=float(props["timeout"]),
        remedy=(
            "Check that the address is a control-plane member that answers with this cluster's talosconfig "
            "(`talosctl -n <address> service etcd`), then run `pulumi up` again."
        ),
    )


class BootstrapProvider(ResourceProvider):
    def check(self, _olds, news):
        return check_bootstrap(news).result()

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=UPDATE_ON)  # never replaced: bootstrap is once

    def create(self, props):
        bootstrap_once(props)
        outs = {k: props.get(k) for k in UPDATE_ON}
        return CreateResult(id_=props["address"], outs={**outs, "bootstrapped": True})

    def update(self, _id, olds, news):
        outs = {k: news.get(k) for k in UPDATE_ON}
        return UpdateResult(outs={**outs, "bootstrapped": olds.get("bootstrapped", True)})

    def read(self, id_, props):
        """Refresh: etcd membership as the node sees it; only its loss changes the record (a
        refresh that finds nothing wrong changes nothing, so a drift check stays quiet). Never
        bootstraps again (a second Bootstrap could split etcd): a cluster that lost etcd
        is reported for an operator (restore from a snapshot)."""
        address = props.get("address")
        try:
            members = node_client(props).etcd_members(timeout=READ_TIMEOUT)
        except TalosError as exc:
            warn(f"Bootstrap {address}: etcd membership not read ({exc.problem}); kept as recorded")
            return ReadResult(id_=id_, outs=props)
        if members:
            return ReadResult(id_=id_, outs=props)
        warn(f"Bootstrap {address}: drift: etcd has no members; the cluster lost its etcd (restore it from a "
             "snapshot; Kontinuum never bootstraps a cluster twice)")
        return ReadResult(id_=id_, outs={**props, "bootstrapped": False})

    def delete(self, _id, _props):
        pass


class Bootstrap(TypedResource, module="talos", name="Bootstrap"):
    """Outputs: bootstrapped (true). The resource id is the node Bootstrap ran on; `address`
    follows the input."""

    bootstrapped: pulumi.Output[bool]
    address: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        address: pulumi.Input[str],
        talosconfig: pulumi.Input[str],
        talos_port: pulumi.Input[int] = APID_PORT,
        timeout: pulumi.Input[float] = WAIT_DEFAULTS.bootstrap,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "address": address,
            "talosPort": talos_port,
            "talosconfig": pulumi.Output.secret(talosconfig),
            "timeout": timeout,
            "bootstrapped": None,
        }
        super().__init__(BootstrapProvider(), resource_name, props, with_secret_outputs(opts, "talosconfig"))
