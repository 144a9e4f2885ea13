"""The zone Gateway's reachable addresses, read with the kubernetes client (no Pulumi).

A Gateway is reachable once Cilium programmed it with an address: its `status.addresses` with
Programmed=True for the current generation (LB-IPAM, or any Cilium that reports host-network
addresses). Cilium 1.18.x never reports an address for a host-network Gateway (its Service is
ClusterIP and the status is copied from load-balancer ingress only: cilium/cilium#42786), while
Envoy does listen on the selected nodes; so in host-network mode an Accepted Gateway is
reachable at the InternalIPs of the Ready nodes its node selector picks. Without either, the wait
fails at its bound naming the ingress setting to choose, long before a certificate timeout would.

Those nodes are the zone's members (DESIGN §11): given the members' addresses, a Node counts only
if one of its InternalIPs is a member's, so a machine that left drops out at once (its Node stays
Ready until its teardown, which runs after this), and the wait lasts until every member has a
Node, Ready where the selector picks it, so one that joined is in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.rest import ApiException

from kontinuum.errors import KontinuumError
from kontinuum.kube import watching
from kontinuum.kube.clients import api_client, describe_error

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
SERVICE_PREFIX = "cilium-gateway-"
LB_CONDITION = "cilium.io/IPAMRequestSatisfied"
REQUEST_TIMEOUT = 15.0
READ_TIMEOUT = 5.0  # each request of a refresh's one look


class GatewayNoAddress(KontinuumError):
    """The Gateway got no reachable address within the bound."""


# -- pure -----------------------------------------------------------------------------------


def condition(obj: dict | None, type_: str) -> dict | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c.get("type") == type_),
                None)


def _current(obj: dict, c: dict | None) -> bool:
    gen = (obj.get("metadata") or {}).get("generation")
    return c is not None and c.get("status") == "True" and (
        c.get("observedGeneration") is None or gen is None or c["observedGeneration"] >= gen)


def programmed_addresses(gw: dict) -> list[str]:
    """Status addresses of a Gateway Programmed for its current generation, else []."""
    if not _current(gw, condition(gw, "Programmed")):
        return []
    return [a["value"] for a in (gw.get("status") or {}).get("addresses") or [] if a.get("value")]


def accepted(gw: dict) -> bool:
    return _current(gw, condition(gw, "Accepted"))


def _internal_ips(node: dict) -> list[str]:
    return [a["address"] for a in (node.get("status") or {}).get("addresses") or [] if a.get("type") == "InternalIP"]


def _ready(node: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def _selected(node: dict, selector: dict) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def node_addresses(nodes: list[dict], selector: dict) -> list[str]:
    """InternalIPs of the Ready nodes carrying every label of `selector`, sorted."""
    return sorted({a for n in nodes if _ready(n) and _selected(n, selector) for a in _internal_ips(n)})


def member_addresses(nodes: list[dict], selector: dict, members: list[str]) -> tuple[list[str], dict[str, str]]:
    """(InternalIPs of the Ready selected Nodes of members, sorted; {member: why it is still to
    come}). A member is still to come while no Node has its address, or while its Node is picked
    by the selector and not Ready; a member whose Node the selector does not pick is settled."""
    found: set[str] = set()
    pending: dict[str, str] = {}
    for member in sorted(set(members)):
        own = [n for n in nodes if member in _internal_ips(n)]
        serving = [n for n in own if _selected(n, selector) and _ready(n)]
        for n in serving:
            found.update(_internal_ips(n))
        if not own:
            pending[member] = "no Node has this address yet"
        elif not serving and any(_selected(n, selector) for n in own):
            pending[member] = f"Node {(own[0].get('metadata') or {}).get('name')} is not Ready"
    return sorted(found), pending


def describe_pending(pending: dict[str, str]) -> str:
    return "; ".join(f"member {m}: {why}" for m, why in sorted(pending.items()))


def describe(gw: dict | None) -> str:
    if gw is None:
        return "the Gateway does not exist"
    parts = []
    for t in ("Accepted", "Programmed"):
        c = condition(gw, t)
        if c:
            parts.append(f"{t}={c.get('status')} ({': '.join(x for x in (c.get('reason'), c.get('message')) if x)})")
    return ", ".join(parts) or "no conditions: no Gateway controller took it (is Cilium's Gateway API enabled, " \
                                "with the GatewayClass `cilium`?)"


def remedy(mode: str, setting: str, *, pool: bool, fixed: str | None, selector: dict) -> str:
    """What to change, by exposure mode."""
    if mode == "hostNetwork":
        chosen = f"the nodes labelled {selector}" if selector else "every Ready node"
        return (f"{setting}: mode hostNetwork serves the Gateway on {chosen}; check {setting}.nodeSelector matches "
                "Ready nodes, or use mode: loadBalancer with addresses")
    if not pool:
        return (f"{setting}: mode loadBalancer without addresses relies on an address pool outside Kontinuum; set "
                f"{setting}.addresses to free addresses on the nodes' network (LB-IPAM with L2 announcements), or "
                "choose mode: hostNetwork (the nodes' own addresses)")
    extra = f" containing {fixed}" if fixed else ""
    return (f"{setting}: check that {setting}.addresses holds a free address{extra} "
            "(kubectl get ciliumloadbalancerippools; the Service's condition says why), or choose mode: hostNetwork")


# -- I/O ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reach:
    """One look at the Gateway: its reachable addresses, the members still to come (host network
    with a member set only) and, while either falls short, what was seen."""

    addresses: list[str]
    pending: dict[str, str] = field(default_factory=dict)
    seen: str = ""


def wait_addresses(kubeconfig: str, namespace: str, name: str, *, mode: str, setting: str, timeout: float,
                   node_selector: dict | None = None, pool: bool = False, fixed: str | None = None,
                   members: list[str] | None = None, interval: float = 2.0) -> Reach:
    """Block (bounded) until the Gateway is reachable and, given `members`, every member is
    settled; returns what it found. At the bound, a Gateway reachable on some members comes back
    with the rest in `pending` (published now, waited for again later); one reachable nowhere
    fails. Looks again as soon as the Gateway (or a Node) changes, at the latest every `interval`."""
    api = api_client(kubeconfig)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    selector = dict(node_selector or {})
    deadline = time.monotonic() + timeout
    last, partial = "no observation yet", None
    watched = [(kubeconfig, watching.custom_objects(GW_GROUP, GW_VERSION, "gateways", namespace, name))]
    if members is not None:
        watched.append((kubeconfig, watching.Source(client.CoreV1Api, "list_node")))
    try:
        with watching.Waker(*watched) as waker:
            while True:
                try:
                    reach = _observe(api, custom, core, namespace, name, mode, selector, fixed, members)
                    if reach.addresses and not reach.pending:
                        return reach
                    last = reach.seen
                    partial = reach if reach.addresses else None
                except ApiException as e:
                    last = "the Gateway does not exist" if e.status == 404 else \
                        f"cannot read the Gateway (HTTP {e.status} {e.reason})"
                except Exception as e:  # noqa: BLE001 - an unreachable apiserver is an observation too
                    last = f"cannot read the Gateway ({describe_error(e)})"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if partial is not None:
                        return partial
                    raise GatewayNoAddress(
                        f"Gateway {namespace}/{name} has no address after {timeout:g} s ({last}). "
                        f"{remedy(mode, setting, pool=pool, fixed=fixed, selector=selector)}. "
                        "Then run `pulumi up` again.")
                waker.pause(min(interval, remaining))
    finally:
        api.close()


def observe_addresses(kubeconfig: str, namespace: str, name: str, *, mode: str, node_selector: dict | None = None,
                      fixed: str | None = None, members: list[str] | None = None,
                      request_timeout: float = READ_TIMEOUT) -> Reach:
    """One look, no wait (a refresh): each request bounded and never retried. A missing Gateway
    is an answer (reachable nowhere); a cluster that does not answer raises."""
    api = api_client(kubeconfig, retries=0)
    try:
        return _observe(api, client.CustomObjectsApi(api), client.CoreV1Api(api), namespace, name, mode,
                        dict(node_selector or {}), fixed, members, request_timeout)
    except ApiException as e:
        if e.status != 404:
            raise
        return Reach([], {}, "the Gateway does not exist")
    finally:
        api.close()


def _observe(api, custom, core, namespace: str, name: str, mode: str, selector: dict, fixed: str | None,
             members: list[str] | None, request_timeout: float = REQUEST_TIMEOUT) -> Reach:
    gw = custom.get_namespaced_custom_object(GW_GROUP, GW_VERSION, namespace, "gateways", name,
                                             _request_timeout=request_timeout)
    if mode == "hostNetwork" and members is not None:
        # The members' Nodes, whatever the status says: a status address (where a Cilium reports
        # one) follows the Nodes late, and a machine that left is still Ready until its teardown.
        if not accepted(gw):
            return Reach([], {}, describe(gw))
        nodes = api.sanitize_for_serialization(core.list_node(_request_timeout=request_timeout).items)
        found, pending = member_addresses(nodes, selector, members)
        chosen = selector or "the (empty) node selector"
        seen = [] if found else [describe(gw), f"no Ready member Node matches {chosen}"]
        return Reach(found, pending, "; ".join(seen + ([describe_pending(pending)] if pending else [])))
    found = programmed_addresses(gw)
    if found and (not fixed or fixed in found):
        return Reach(found)
    seen = describe(gw)
    if mode == "hostNetwork" and accepted(gw):
        nodes = api.sanitize_for_serialization(core.list_node(_request_timeout=request_timeout).items)
        found = node_addresses(nodes, selector)
        if found:
            return Reach(found)
        seen += f"; no Ready node matches {selector or 'the (empty) node selector'}"
    elif mode == "loadBalancer":
        seen += _service_condition(core, namespace, name, request_timeout)
    return Reach([], {}, seen)


def _service_condition(core: client.CoreV1Api, namespace: str, gateway: str, request_timeout: float) -> str:
    """`; Service …: <LB-IPAM condition>` for the message (best effort)."""
    name = (SERVICE_PREFIX + gateway)[:63]
    try:
        svc = core.read_namespaced_service(name, namespace, _request_timeout=request_timeout)
    except Exception:  # noqa: BLE001 - for the message only
        return ""
    for c in (svc.status.conditions if svc.status else None) or []:
        if c.type == LB_CONDITION and c.status != "True":
            return f"; Service {name}: {c.reason}: {c.message}"
    return ""
