"""The machine's MachineStatus (MachineStatuses.runtime.talos.dev, id machine), as Talos 1.13's
MachineStatusController derives it (failure-facts §2):

- stage: maintenance; rebooting while a reboot shuts the machine down (its API still answers);
  booting from a boot until the boot sequence is done, i.e. until its services are up (the
  kubelet Running and healthy, on a control plane etcd too); running afterwards.
- ready: in the booting and running stages only when every readiness check passes, otherwise
  with unmetConditions [{name, reason}] in Talos's words; in other stages ready with none.
  Checks: `services` (every service Running and healthy; apid, machined, kubelet required, etcd
  and trustd on a control plane) and `nodeReady` (the Node of this machine is Ready, as the lab
  learnt from the apiserver: EmulatedNode.node_ready; "status is not available yet" before it
  knows). Time and network are always in order in the lab; static pods are not checked here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lab.talos_node import services as machine_services

if TYPE_CHECKING:
    from lab.talos_node.node import EmulatedNode

REQUIRED = ("apid", "machined", "kubelet")
REQUIRED_CONTROL_PLANE = ("etcd", "trustd")


def status(node: EmulatedNode) -> tuple[str, bool, list[dict]]:
    """(stage, ready, unmetConditions) of `node` now."""
    if node.mode == "maintenance":
        return "maintenance", True, []
    if node.mode in ("rebooting", "off", "crashed"):
        return "rebooting", True, []
    if node.mode != "configured" or node.config is None:
        return "booting", False, [{"name": "services", "reason": "kubelet not running"}]
    services = machine_services.of(node)
    unmet = [{"name": name, "reason": reason} for name, reason in (
        ("services", _services_problem(node, services)),
        ("nodeReady", _node_problem(node)),
    ) if reason]
    return ("running" if _booted(node, services) else "booting"), not unmet, unmet


def _booted(node: EmulatedNode, services: list[machine_services.Service]) -> bool:
    """The boot sequence waits for every service it started to be up (Running and healthy)."""
    up = {s.id for s in services if s.state == "Running" and s.healthy}
    needed = ["kubelet"] + (["etcd"] if node.is_control_plane else [])
    return all(name in up for name in needed)


def _services_problem(node: EmulatedNode, services: list[machine_services.Service]) -> str | None:
    """Talos's servicesCheck over the Service resources (which exist only while Running)."""
    running = [s for s in services if s.state == "Running"]
    problems = [f"{s.id} not healthy" for s in running if not s.healthy]
    required = REQUIRED + (REQUIRED_CONTROL_PLANE if node.is_control_plane else ())
    problems += [f"{name} not running" for name in required if name not in {s.id for s in running}]
    return ", ".join(problems) or None


def _node_problem(node: EmulatedNode) -> str | None:
    if node.node_ready is None:
        return f'node "{node.hostname}" status is not available yet'
    return None if node.node_ready else f'node "{node.hostname}" is not ready'
