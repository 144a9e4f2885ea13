"""LostMachines: one per zone, the machines its stack config declares lost, taken out before any
machine joins (kontinuum/lifecycle/lost_machines.py: member removal behind a quorum check, Node
deletion, reset of a lost machine that answers again). check/diff are pure. While any machine is
declared lost every `pulumi up` runs it again, because only a run can see a lost machine come
back; a zone with none never calls a node for it.
"""

from __future__ import annotations

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, with_secret_outputs
from providers.talos_common import cluster_kubeconfig, info, known, node_client, warn

ROLES = ("controlplane", "worker")


def check_lost(news: dict) -> list[CheckFailure]:
    failures = []
    lost = news.get("lost")
    if not isinstance(lost, list):
        return [CheckFailure("lost", "must be a list of {name, address, role, path}")]
    for i, m in enumerate(lost):
        if not isinstance(m, dict) or not all(m.get(k) for k in ("name", "address", "role", "path")):
            failures.append(CheckFailure("lost", f"entry {i} must have name, address, role and path"))
        elif m["role"] not in ROLES:
            failures.append(CheckFailure("lost", f"entry {i}: role must be one of {', '.join(ROLES)}"))
    for key in ("talosconfig", "hubKubeconfig"):
        if lost and not news.get(key):
            failures.append(CheckFailure(key, "required when machines are lost (secret)"))
    return failures


def diff_lost(olds: dict, news: dict) -> DiffResult:
    """A change of the list, or any lost machine at all (a run checks whether it came back)."""
    lost = news.get("lost")
    changed = olds.get("lost") != lost or olds.get("controlPlanes") != news.get("controlPlanes")
    return DiffResult(changes=bool(changed or not known(lost) or lost))


def _back_in_maintenance(props: dict, machine) -> None:
    """A reset lost machine back in maintenance mode, its new certificate recorded (the teardown's wait)."""
    from providers.node_teardown import back_in_maintenance

    back_in_maintenance({**props, "address": machine.address, "instance": machine.name},
                        f"lost machine {machine.address} back in maintenance mode after its reset",
                        timeout=float(props["timeout"]),
                        remedy="It may still be wiping its disk: run `pulumi up` again (a reset machine is not reset twice).")


def _run(props: dict, handled: set[str]) -> dict:
    from kontinuum.lifecycle.lost_machines import LostMachine, delete_nodes, take_out

    lost = [LostMachine(m["name"], m["address"], m["role"], m["path"]) for m in props.get("lost") or []]
    if not lost:
        return {**props, "handled": [], "reset": []}
    cps = list(props.get("controlPlanes") or [])
    result = take_out(lost, handled, client_for=lambda a: node_client(props, a), control_planes=cps,
                      remove_nodes=lambda new: delete_nodes(
                          new, cluster_kubeconfig(props, first=cps[0] if cps else None), props["zone"], info),
                      after_reset=lambda m: _back_in_maintenance(props, m), zone=props["zone"], log=info)
    for address in result["reset"]:
        warn(f"{props['zone']}: lost machine {address} came back and was reset to maintenance mode")
    return {**props, **result}


class LostMachinesProvider(ResourceProvider):
    def check(self, _olds, news):
        return CheckResult(news, check_lost(news))

    def diff(self, _id, olds, news):
        return diff_lost(olds, news)

    def create(self, props):
        return CreateResult(id_=props["zone"], outs=_run(props, set()))

    def update(self, _id, olds, news):
        return UpdateResult(outs=_run(news, set(olds.get("handled") or [])))

    def delete(self, _id, _props):
        pass  # nothing to undo: the members stay removed, the machines stay reset


class LostMachines(TypedResource, module="talos", name="LostMachines"):
    """Outputs: handled (the Instances of the lost machines taken out), reset (the addresses of
    lost machines that came back and were reset by the last run)."""

    handled: pulumi.Output[list]

    def __init__(self, resource_name: str, *, zone: str, lost: list[dict], control_planes: pulumi.Input[list],
                 talosconfig: pulumi.Input[str], hub_kubeconfig: pulumi.Input[str], talos_port: int, timeout: float,
                 opts: pulumi.ResourceOptions | None = None):
        """lost: [{name, address, role, path}] of every machine the stack config marks lost;
        timeout: seconds a lost machine that came back gets to show up reset."""
        props = {"zone": zone, "lost": lost, "controlPlanes": control_planes,
                 "talosconfig": pulumi.Output.secret(talosconfig), "hubKubeconfig": pulumi.Output.secret(hub_kubeconfig),
                 "talosPort": talos_port, "timeout": timeout, "handled": None, "reset": None}
        super().__init__(LostMachinesProvider(), resource_name, props,
                         with_secret_outputs(opts, "talosconfig", "hubKubeconfig"))
