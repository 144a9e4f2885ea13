"""The zone Gateway's reachable addresses, read with the kubernetes client (no Pulumi).

A Gateway is reachable once Cilium programmed it with an address: its `status.addresses` with
Programmed=True for the current generation (LB-IPAM, or any Cilium that reports host-network
addresses). Cilium 1.18.x never reports an address for a host-network Gateway (its Service is
ClusterIP and the status is copied from load-balancer ingress only: cilium/cilium#42786), while
Envoy does listen on the selected nodes; so in host-network mode an Accepted Gateway is
reachable at the InternalIPs of the Ready nodes its node selector picks. Without either, the wait
fails at its bound naming the ingress setting to choose, long before a certificate timeout would.
"""

from __future__ import annotations

import time

from kubernetes import client
from kubernetes.client.rest import ApiException

from kontinuum.errors import KontinuumError
from kontinuum.kube import watching
from kontinuum.kube.clients import api_client, describe_error

GW_GROUP, GW_VERSION = "gateway.networking.k8s.io", "v1"
SERVICE_PREFIX = "cilium-gateway-"
LB_CONDITION = "cilium.io/IPAMRequestSatisfied"
REQUEST_TIMEOUT = 15.0


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


def node_addresses(nodes: list[dict], selector: dict) -> list[str]:
    """InternalIPs of the Ready nodes carrying every label of `selector`, sorted."""
    out = []
    for n in nodes:
        labels = (n.get("metadata") or {}).get("labels") or {}
        status = n.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if ready and all(labels.get(k) == v for k, v in selector.items()):
            out += [a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"]
    return sorted(set(out))


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


def wait_addresses(kubeconfig: str, namespace: str, name: str, *, mode: str, setting: str, timeout: float,
                   node_selector: dict | None = None, pool: bool = False, fixed: str | None = None,
                   interval: float = 2.0) -> list[str]:
    """Block (bounded) until the Gateway is reachable; returns its addresses. Looks again as soon
    as the Gateway changes (a watch), at the latest every `interval`."""
    api = api_client(kubeconfig)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    selector = dict(node_selector or {})
    deadline = time.monotonic() + timeout
    last = "no observation yet"
    watched = watching.custom_objects(GW_GROUP, GW_VERSION, "gateways", namespace, name)
    try:
        with watching.Waker((kubeconfig, watched)) as waker:
            while True:
                try:
                    found, last = _observe(api, custom, core, namespace, name, mode, selector, fixed)
                    if found:
                        return found
                except ApiException as e:
                    last = "the Gateway does not exist" if e.status == 404 else \
                        f"cannot read the Gateway (HTTP {e.status} {e.reason})"
                except Exception as e:  # noqa: BLE001 - an unreachable apiserver is an observation too
                    last = f"cannot read the Gateway ({describe_error(e)})"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise GatewayNoAddress(
                        f"Gateway {namespace}/{name} has no address after {timeout:g} s ({last}). "
                        f"{remedy(mode, setting, pool=pool, fixed=fixed, selector=selector)}. "
                        "Then run `pulumi up` again.")
                waker.pause(min(interval, remaining))
    finally:
        api.close()


def _observe(api, custom, core, namespace: str, name: str, mode: str, selector: dict,
             fixed: str | None) -> tuple[list[str], str]:
    """(reachable addresses or [], what was seen)."""
    gw = custom.get_namespaced_custom_object(GW_GROUP, GW_VERSION, namespace, "gateways", name,
                                             _request_timeout=REQUEST_TIMEOUT)
    found = programmed_addresses(gw)
    if found and (not fixed or fixed in found):
        return found, ""
    seen = describe(gw)
    if mode == "hostNetwork" and accepted(gw):
        nodes = api.sanitize_for_serialization(core.list_node(_request_timeout=REQUEST_TIMEOUT).items)
        found = node_addresses(nodes, selector)
        if found:
            return found, ""
        seen += f"; no Ready node matches {selector or 'the (empty) node selector'}"
    elif mode == "loadBalancer":
        seen += _service_condition(core, namespace, name)
    return [], seen


def _service_condition(core: client.CoreV1Api, namespace: str, gateway: str) -> str:
    """`; Service …: <LB-IPAM condition>` for the message (best effort)."""
    name = (SERVICE_PREFIX + gateway)[:63]
    try:
        svc = core.read_namespaced_service(name, namespace, _request_timeout=REQUEST_TIMEOUT)
    except Exception:  # noqa: BLE001 - for the message only
        return ""
    for c in (svc.status.conditions if svc.status else None) or []:
        if c.type == LB_CONDITION and c.status != "True":
            return f"; Service {name}: {c.reason}: {c.message}"
    return ""
