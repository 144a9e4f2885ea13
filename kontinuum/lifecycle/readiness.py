"""The one readiness gate after a node reboots (config change, Talos upgrade): the next node
goes down only when this one is really back (issue 28; reference/failure-facts.md §2).

Back means, in this order, each check naming what is not ready yet:
1. Talos: the boot id differs from the one read before the reboot, and the machine status is
   RUNNING and ready (what talosctl's tracker waits for);
2. Kubernetes: the node's Node is Ready and reports the new boot id (a Ready from before the
   reboot does not count), and its Cilium agent pod is Ready;
3. a control plane: its static pods run the config Talos rendered last (`talos.dev/config-version`
   of the mirror pod equals the node's StaticPod resource) and are Ready, and etcd is healthy with
   every member.
A Kubernetes API that does not answer (its apiserver may be the node that rebooted) is a
"not yet", never a pass. Everything is bounded by the caller's timeout.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

from kubernetes import client

from kontinuum.errors import KontinuumError
from kontinuum.kube.clients import api_client, describe_error
from kontinuum.kube.drain import node_for
from kontinuum.lifecycle import etcd_health
from kontinuum.talos import cosi, lifecycle
from kontinuum.talos.client import TalosClient
from kontinuum.talos.errors import TalosError
from kontinuum.talos.waits import WAIT_DEFAULTS, NotYet, WaitTimeout, wait_until

REQUEST_TIMEOUT = 5.0
CILIUM_AGENT = "k8s-app=cilium"
STATIC_PODS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
_POLL = dataclasses.replace(WAIT_DEFAULTS, first_pause=0.2, max_pause=0.5)  # a rollout waits on every node


class NodeNotReadyError(KontinuumError):
    pass


@dataclass(frozen=True)
class Target:
    address: str
    name: str  # how messages name the node (its Instance)
    control_plane: bool


@dataclass(frozen=True)
class Gate:
    client_for: Callable[[str], TalosClient]
    kubeconfig: Callable[[], str | None]  # the cluster's admin kubeconfig (None: not reachable now)
    control_planes: tuple[str, ...]  # for the etcd check


def talos_problem(client: TalosClient, boot_before: str | None, left: float) -> tuple[str | None, str | None]:
    """(problem or None, the boot id now)."""
    try:
        booted = lifecycle.boot_id(client, timeout=min(left, 5.0))
        if boot_before is not None and booted == boot_before:
            return "the node has not rebooted yet (same boot id)", booted
        status = cosi.machine_status(client, timeout=min(left, 5.0))
    except TalosError as e:
        return f"Talos API: {e.problem}", None
    return status.problem(), booted


def _ready(obj) -> tuple[bool, str]:
    for c in (obj.status.conditions or []) if obj.status else []:
        if c.type == "Ready":
            return c.status == "True", f"Ready={c.status}" + (f" ({c.reason}: {c.message})" if c.reason else "")
    return False, "no Ready condition"


def kubernetes_problem(core: client.CoreV1Api, target: Target, boot_id: str | None,
                       versions: dict[str, str | None]) -> str | None:
    node = node_for(core, target.address)
    if node is None:
        return "no Kubernetes Node has this address yet"
    name = node.metadata.name
    ready, why = _ready(node)
    if not ready:
        return f"Node {name} is not Ready ({why})"
    seen = node.status.node_info.boot_id if node.status and node.status.node_info else ""
    if boot_id and seen != boot_id:
        return f"Node {name} still reports boot id {seen or '(none)'}, not the node's {boot_id}: its kubelet has not reported since the reboot"
    pods = core.list_namespaced_pod("kube-system", field_selector=f"spec.nodeName={name}",
                                    _request_timeout=REQUEST_TIMEOUT).items
    labels = [(p, p.metadata.labels or {}) for p in pods if p.metadata.deletion_timestamp is None]
    agents = [p for p, lb in labels if lb.get("k8s-app") == "cilium"]
    if not agents:
        return f"no Cilium agent pod runs on Node {name} yet"
    if not any(_ready(p)[0] for p in agents):
        return f"the Cilium agent pod {agents[0].metadata.name} on Node {name} is not Ready ({_ready(agents[0])[1]})"
    if target.control_plane:
        return _static_pod_problem(labels, name, versions)
    return None


def _static_pod_problem(labels: list, node: str, versions: dict[str, str | None]) -> str | None:
    for component in STATIC_PODS:
        mirror = next((p for p, lb in labels if lb.get("k8s-app") == component), None)
        if mirror is None:
            return f"the static pod {component} has no mirror pod on Node {node} yet"
        want = versions.get(component)
        have = (mirror.metadata.annotations or {}).get(cosi.CONFIG_VERSION)
        if want is not None and have != want:
            return f"the static pod {component} on Node {node} runs config version {have}, not {want}"
        ready, why = _ready(mirror)
        if not ready:
            return f"the static pod {component} on Node {node} is not Ready ({why})"
    return None


class _KubeApi:
    """One Kubernetes API client for a whole wait (built once the kubeconfig is known; its
    connection pool reconnects when the apiserver comes back), closed when the wait ends."""

    def __init__(self, kubeconfig: Callable[[], str | None]) -> None:
        self._kubeconfig, self._api = kubeconfig, None

    def core(self) -> client.CoreV1Api | None:
        if self._api is None and (text := self._kubeconfig()) is not None:
            self._api = api_client(text, retries=0)
        return None if self._api is None else client.CoreV1Api(self._api)

    def close(self) -> None:
        if self._api is not None:
            self._api.close()


def problem(gate: Gate, target: Target, boot_before: str | None, left: float, kube: _KubeApi) -> str | None:
    """None when the node is back and ready; else the first thing that is not."""
    talos = gate.client_for(target.address)
    found, booted = talos_problem(talos, boot_before, left)
    if found:
        return found
    versions = {}
    if target.control_plane:
        try:
            versions = {c: cosi.static_pod_version(talos, c, timeout=min(left, 5.0)) for c in STATIC_PODS}
        except TalosError as e:
            return f"Talos API: {e.problem}"
    core = kube.core()
    if core is None:
        return "the Kubernetes API is not reachable yet"
    try:
        found = kubernetes_problem(core, target, booted, versions)
    except Exception as e:  # any API failure while nodes come back is a "not yet"
        return f"the Kubernetes API does not answer ({describe_error(e)})"
    if found or not target.control_plane:
        return found
    return etcd_health.problem(gate.client_for, list(gate.control_planes), left)


def wait_ready(gate: Gate, target: Target, *, boot_before: str | None, timeout: float,
               started: float | None = None, log: Callable[[str], None] = lambda _: None) -> None:
    """Wait (bounded) until `target` is back from its reboot and ready; NodeNotReadyError names
    what was still not ready."""
    kube = _KubeApi(gate.kubeconfig)

    def probe(left: float) -> None:
        if (p := problem(gate, target, boot_before, left, kube)) is not None:
            raise NotYet(p)

    begun = time.monotonic()
    try:
        wait_until(f"{target.name} ({target.address}) to be ready after its reboot", probe, timeout=timeout,
                   started=started, bounds=_POLL, remedy="")
    except WaitTimeout as e:
        raise NodeNotReadyError(
            f"{target.name} ({target.address}) is not ready after its reboot: {e.last} (waited {timeout:g} s). "
            "The nodes after it were not touched. Find why (talosctl -n <node> health, its console), then run "
            "`pulumi up` again: it resumes with this node.") from None
    finally:
        kube.close()
    log(f"{target.address}: ready again after {time.monotonic() - begun:.1f} s")
