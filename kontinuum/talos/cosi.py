"""COSI reads over the Talos API (cosi.resource.State/Get), the way talosctl reads a node's
state: the machine status a reboot waiter follows and the static pods a control plane runs
(reference/failure-facts.md §2 and §4). Each call is bounded like every TalosClient operation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from kontinuum.talos.client import TalosClient
from protos.gen.v1alpha1 import state_grpc, state_pb2

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


def get_yaml(client: TalosClient, namespace: str, rtype: str, rid: str, *, timeout: float | None = None) -> Any:
    """One resource's spec, decoded from its YAML; None when the node has no such resource."""

    async def body(channel: Any, md: dict, t: float) -> Any:
        try:
            got = await state_grpc.StateStub(channel).Get(
                state_pb2.GetRequest(namespace=namespace, type=rtype, id=rid), timeout=t, metadata=md)
        except GRPCError as e:
            if e.status == Status.NOT_FOUND:
                return None
            raise
        return yaml.safe_load(got.resource.spec.yaml_spec)

    return client._run(f"get {rtype}", timeout or GET_DEADLINE, body)


def machine_status(client: TalosClient, *, timeout: float | None = None) -> MachineStatus:
    spec = get_yaml(client, *MACHINE_STATUS, timeout=timeout) or {}
    status = spec.get("status") or {}
    unmet = tuple(f"{c.get('name')}: {c.get('reason')}" for c in status.get("unmetConditions") or [])
    return MachineStatus(str(spec.get("stage") or "unknown"), bool(status.get("ready")), unmet)


def static_pod_version(client: TalosClient, component: str, *, timeout: float | None = None) -> str | None:
    """The config version Talos rendered for a control plane's static pod (None: not rendered)."""
    spec = get_yaml(client, *STATIC_POD, component, timeout=timeout)
    pod = (spec or {}).get("pod") or {}
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(CONFIG_VERSION)
