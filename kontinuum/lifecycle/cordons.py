"""Our cordon around a node's reboot (config rollout, Talos upgrade): drain before, uncordon
after. Only a cordon we marked (kube/drain.py CORDONED_BY with our reason) is ever undone; after
a failure before the reboot it is undone at once, and one a killed run left is undone once the
node passes the readiness gate.
"""

from __future__ import annotations

from typing import Callable

from kontinuum.errors import KontinuumError
from kontinuum.kube import drain as kube_drain
from kontinuum.lifecycle import readiness

Log = Callable[[str], None]


def cordon(gate: readiness.Gate, target: readiness.Target, *, reason: str, timeout: float, log: Log,
           without_api: str) -> None:
    """Cordon and drain; `without_api` is what the user can do when the API does not answer."""
    kubeconfig = gate.kubeconfig()
    if kubeconfig is None:
        raise KontinuumError(f"{target.name} ({target.address}): the cluster API does not answer, so its Node cannot "
                             f"be drained before {reason.replace('-', ' ')} reboots it. {without_api}")
    kube_drain.drain(kubeconfig, target.address, timeout=timeout, log=log, reason=reason)


def uncordon(gate: readiness.Gate, address: str, *, reason: str, log: Log) -> None:
    kubeconfig = gate.kubeconfig()
    if kubeconfig is None:
        log(f"{address}: the cluster API is not reachable to uncordon its Node; the next run does it")
        return
    if (name := kube_drain.uncordon(kubeconfig, address, reason)) is not None:
        log(f"{address}: Node {name} uncordoned")


def try_uncordon(gate: readiness.Gate, address: str, *, reason: str, log: Log) -> None:
    """After a failure: the original error is what the user needs to read, so this never raises."""
    try:
        uncordon(gate, address, reason=reason, log=log)
    except Exception as e:  # noqa: BLE001
        log(f"{address}: could not uncordon its Node after the failure ({e}); the next run does it")


def resume(gate: readiness.Gate, target: readiness.Target, *, reason: str, timeout: float, log: Log,
           started: float | None = None) -> None:
    """A node a killed run rebooted may still carry our cordon: undo it once the node is ready."""
    kubeconfig = gate.kubeconfig()
    if kubeconfig is None or kube_drain.cordoned_for(kubeconfig, target.address) != reason:
        return
    readiness.wait_ready(gate, target, boot_before=None, timeout=timeout, started=started, log=log)
    uncordon(gate, target.address, reason=reason, log=log)
