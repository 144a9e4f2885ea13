"""What a reboot waiter reads of a node's COSI state (TalosClient.resource), as talosctl does: the
machine status (reference/failure-facts.md §2) and the config version of the static pods a
control plane runs (§4). Each call is bounded like every TalosClient operation.
"""

from __future__ import annotations

from dataclasses import dataclass

from kontinuum.talos.client import TalosClient

MACHINE_STATUS = ("runtime", "MachineStatuses.runtime.talos.dev", "machine")
STATIC_POD = ("k8s", "StaticPods.kubernetes.talos.dev")
CONFIG_VERSION = "talos.dev/config-version"  # what Talos writes on each static pod it renders
GET_DEADLINE = 10.0


@dataclass(frozen=True)
class MachineStatus:
    stage: str  # booting, running, rebooting, ... (machinestage.go, lower case)
    ready: bool
    unmet: tuple[str, ...]  # "name: reason" of each unmet readiness condition

    def problem(self) -> str | None:
        """None when talosctl's tracker would stop waiting: stage running and ready."""
        if self.stage == "running" and self.ready:
            return None
        unmet = f" ({'; '.join(self.unmet)})" if self.unmet else ""
        return f"Talos machine status is {self.stage}, {'ready' if self.ready else 'not ready'}{unmet}"


def machine_status(client: TalosClient, *, timeout: float | None = None) -> MachineStatus:
    spec = client.resource(*MACHINE_STATUS, timeout=timeout or GET_DEADLINE) or {}
    status = spec.get("status") or {}
    unmet = tuple(f"{c.get('name')}: {c.get('reason')}" for c in status.get("unmetConditions") or [])
    return MachineStatus(str(spec.get("stage") or "unknown"), bool(status.get("ready")), unmet)


def static_pod_version(client: TalosClient, component: str, *, timeout: float | None = None) -> str | None:
    """The config version Talos rendered for a control plane's static pod (None: not rendered)."""
    pod = client.resource(*STATIC_POD, component, timeout=timeout or GET_DEADLINE) or {}  # its spec is the Pod
    version = ((pod.get("metadata") or {}).get("annotations") or {}).get(CONFIG_VERSION)
    return None if version is None else str(version)
