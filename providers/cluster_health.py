"""ClusterHealth: Talos's own cluster health check, the convergence gate (seeds).

The check runs server-side on one control-plane node (ClusterService.HealthCheck, as
`talosctl health` does) with the expected control-plane nodes and the listed workers that
have joined; `timeout` is its
server wait_timeout and the client deadline adds Deadlines.health_check_slack, so the node
gives its own verdict first. Progress lines go to the Pulumi log; a failure names the last
one. A node that is briefly unreachable is retried within the same bound. Every create and
update runs the check again; nothing is changed on any node.
"""

from __future__ import annotations


import pulumi
from pulumi.dynamic import CreateResult, ResourceProvider, UpdateResult

from kontinuum.errors import KontinuumError
from kontinuum.talos.errors import ClusterUnhealthyError, TalosError
from kontinuum.talos.talosconfig import APID_PORT
from kontinuum.talos.waits import WAIT_DEFAULTS, NotYet, WaitTimeout, wait_until
from providers.common import TypedResource, diff_inputs, with_secret_outputs
from providers.talos_common import TRANSIENT, Inputs, cluster_kubeconfig, info, node_client

UPDATE_ON = ("address", "talosPort", "talosconfig", "controlPlaneNodes", "workerNodes", "timeout")


class ClusterNotHealthy(KontinuumError):
    pass


def check_cluster_health(news: dict) -> Inputs:
    inputs = Inputs(news)
    inputs.string("address", "the control-plane node that runs the check")
    inputs.port()
    inputs.talosconfig()
    inputs.strings("controlPlaneNodes", "control-plane node addresses")
    inputs.optional_strings("workerNodes", "worker node addresses")
    inputs.seconds("timeout", WAIT_DEFAULTS.health)
    return inputs


JOIN_PROBE = 5.0  # seconds to ask a listed worker whether it runs this cluster's config


def joined_workers(props: dict, control_planes: list[str] | None = None) -> list[str]:
    """The workers in the cluster now: those listed, and those the cluster still has a Node for
    (a machine on its way out: the engine deletes a leaving machine's resources after every
    update of this run), each only while it runs this cluster's config (it answers over mTLS
    with its talosconfig). Talos's check wants the node set as it is; a listed worker that has
    not joined yet (the gate runs before workers join) is not part of it."""
    from kontinuum.kube.clients import describe_error  # the provider process only: keeps the program light
    from kontinuum.kube.drain import internal_ips

    cps = set(props["controlPlaneNodes"] if control_planes is None else control_planes)
    candidates = list(props.get("workerNodes") or [])
    kubeconfig = cluster_kubeconfig(props, first=props["address"])
    if kubeconfig is not None:
        try:
            candidates += [ip for ip in internal_ips(kubeconfig) if ip not in cps and ip not in candidates]
        except Exception as exc:  # noqa: BLE001 - the check itself will say what is wrong with the API
            info(f"{props['address']}: the cluster's Nodes could not be listed ({describe_error(exc)})")
    joined = []
    for worker in candidates:
        try:
            node_client(props, worker).version(timeout=JOIN_PROBE)
            joined.append(worker)
        except TalosError as exc:
            info(f"{worker}: not checked, it does not run this cluster's config now ({exc.problem})")
    return joined


def current_control_planes(props: dict) -> list[str]:
    """The control planes listed, and those still etcd members: a control plane on its way out
    (scale-down; the engine deletes its resources after every update of this run) is still one
    for Talos's check until it has left."""
    from kontinuum.lifecycle.etcd_health import member_address

    cps = list(props["controlPlaneNodes"])
    try:
        client = node_client(props)
        members = client.etcd_members(timeout=client.deadlines.etcd)
    except TalosError:
        return cps  # the check itself says what is wrong with etcd
    return cps + sorted({member_address(m) for m in members} - set(cps))


def run_health_check(props: dict) -> list[str]:
    """The nodes checked; raises ClusterNotHealthy with the node's last progress line."""
    address = props["address"]
    client = node_client(props)
    cps = current_control_planes(props)
    workers = joined_workers(props, cps)
    bound = float(props["timeout"])
    seen = []  # progress lines; the client adds the last one to its errors

    def progress(line: str) -> None:
        seen.append(line)
        info(f"{address}: health: {line}")

    def attempt(left: float) -> None:
        try:
            client.health_check(cps, workers, wait_timeout=left, on_progress=progress)
        except ClusterUnhealthyError as exc:
            quiet = "" if seen else "; the node sent no progress line"
            raise ClusterNotHealthy(
                f"ClusterHealth via {address}: Talos's health check did not pass within {bound:g} s "
                f"({exc.problem}{quiet}). {exc.remedy}"
            ) from None
        except TRANSIENT as exc:
            raise NotYet(exc.problem) from exc

    try:
        wait_until(f"ClusterHealth via {address}", attempt, timeout=bound, remedy="")
    except WaitTimeout as exc:
        raise ClusterNotHealthy(
            f"ClusterHealth via {address}: the health check could not run to its end within {bound:g} s; last "
            f"observation: {exc.last}. Check that {address} is a control plane that answers with this cluster's "
            "talosconfig, then run `pulumi up` again."
        ) from None
    info(f"{address}: cluster healthy ({len(cps)} control plane, {len(workers)} worker nodes)")
    return cps + workers


class ClusterHealthProvider(ResourceProvider):
    def check(self, _olds, news):
        return check_cluster_health(news).result()

    def diff(self, _id, olds, news):
        return diff_inputs(olds, news, update_on=UPDATE_ON)

    def _run(self, props: dict) -> dict:
        checked = run_health_check(props)
        return {**{k: props.get(k) for k in UPDATE_ON}, "healthy": True, "checkedNodes": checked}

    def create(self, props):
        return CreateResult(id_=props["address"], outs=self._run(props))

    def update(self, _id, _olds, news):
        return UpdateResult(outs=self._run(news))


class ClusterHealth(TypedResource, module="talos", name="ClusterHealth"):
    """Outputs: healthy (true), checkedNodes (control planes, then workers)."""

    healthy: pulumi.Output[bool]
    checkedNodes: pulumi.Output[list]

    def __init__(
        self,
        resource_name: str,
        *,
        address: pulumi.Input[str],
        talosconfig: pulumi.Input[str],
        control_plane_nodes: pulumi.Input[list],
        worker_nodes: pulumi.Input[list] | None = None,
        talos_port: pulumi.Input[int] = APID_PORT,
        timeout: pulumi.Input[float] = WAIT_DEFAULTS.health,
        opts: pulumi.ResourceOptions | None = None,
    ):
        props = {
            "address": address,
            "talosPort": talos_port,
            "talosconfig": pulumi.Output.secret(talosconfig),
            "controlPlaneNodes": control_plane_nodes,
            "workerNodes": worker_nodes if worker_nodes is not None else [],
            "timeout": timeout,
            "healthy": None,
            "checkedNodes": None,
        }
        super().__init__(ClusterHealthProvider(), resource_name, props, with_secret_outputs(opts, "talosconfig"))
