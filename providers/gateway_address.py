"""GatewayAddress: a wait resource whose create blocks (bounded) until the zone's Gateway is
reachable, and whose output is its address(es): the gate before DNS and the Certificate wait,
so a Gateway nobody gives an address fails fast, naming the ingress setting to check.

check/diff are pure; the wait is kontinuum.kube.gateways. `trigger` ties it to the Gateway
resource (uid/generation) and the exposure settings, so a changed Gateway or mode waits again.
In host-network mode the addresses are the member machines' (DESIGN §11), so `members` (their
addresses) is an input too: every join and leave updates it and waits again, and a refresh
reads the Gateway's addresses as they are now.
"""

from __future__ import annotations

import ipaddress

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, ReadResult, ResourceProvider, UpdateResult

from providers.common import TypedResource, cluster_wait_failures, diff_inputs, why_not_read, with_secret_outputs

UPDATE_ON = ("namespace", "name", "mode", "nodeSelector", "pool", "fixed", "trigger", "kubeconfig", "members")
MODES = ("hostNetwork", "loadBalancer")


def members_failure(members) -> CheckFailure | None:
    """None for no member set, an unknown (preview) or a list of IP addresses."""
    from providers.talos_common import known

    if members is None or not known(members):
        return None
    bad = [m for m in members if not _is_ip(m)] if isinstance(members, list) else None
    if bad is None or bad:
        return CheckFailure("members", f"must be a list of the member machines' IP addresses, got "
                                       f"{(bad or members)!r}")
    return None


def _is_ip(value) -> bool:
    if not isinstance(value, str):  # ipaddress takes integers too
        return False
    try:
        ipaddress.ip_address(value)
        return True
    except (TypeError, ValueError):
        return False


def _warn(message: str) -> None:
    from providers.talos_common import warn

    warn(message)


class GatewayAddressProvider(ResourceProvider):
    def check(self, _olds, news):
        failures = cluster_wait_failures(news, "namespace", "name", "setting")
        if news.get("mode") not in MODES:
            failures.append(CheckFailure("mode", f"must be one of {', '.join(MODES)}, got {news.get('mode')!r}"))
        if (failure := members_failure(news.get("members"))) is not None:
            failures.append(failure)
        return CheckResult(news, failures)

    def diff(self, _id, olds, news):
        d = diff_inputs(olds, news, update_on=UPDATE_ON)
        # Waited for again: members that had not come at the bound, or a refresh that found the
        # Gateway reachable nowhere.
        if not d.changes and (olds.get("pending") or olds.get("addresses") == []):
            d.changes = True
        return d

    def _wait(self, props: dict, id_: str) -> dict:
        from kontinuum.kube.gateways import describe_pending, wait_addresses

        reach = wait_addresses(props["kubeconfig"], props["namespace"], props["name"], mode=props["mode"],
                               setting=props["setting"], timeout=float(props["timeout"]),
                               node_selector=props.get("nodeSelector") or {}, pool=bool(props.get("pool")),
                               fixed=props.get("fixed") or None, members=props.get("members"))
        if reach.pending:
            _warn(f"GatewayAddress {id_}: published on {', '.join(reach.addresses)} without the members not settled "
                  f"after {float(props['timeout']):g} s ({describe_pending(reach.pending)}); the next `pulumi up` "
                  "waits for them again. A machine that is gone for good: declare it lost in the stack config.")
        return {**props, "addresses": reach.addresses, "pending": sorted(reach.pending)}

    def create(self, props):
        id_ = f"{props['namespace']}/{props['name']}"
        return CreateResult(id_=id_, outs=self._wait(props, id_))

    def update(self, id_, _olds, news):
        return UpdateResult(outs=self._wait(news, id_))

    def read(self, id_, props):
        """Refresh: the Gateway's addresses now (one bounded look, no wait). Changed addresses
        are recorded, so the DNS record and the outputs follow at the next up; a Gateway reachable
        nowhere records none, so the next up waits for it again; a cluster that does not answer
        keeps the record (reported)."""
        from kontinuum.kube.gateways import describe_pending, observe_addresses

        try:
            reach = observe_addresses(props["kubeconfig"], props["namespace"], props["name"], mode=props["mode"],
                                      node_selector=props.get("nodeSelector") or {},
                                      fixed=props.get("fixed") or None, members=props.get("members"))
        except Exception as exc:  # noqa: BLE001 - any failure to read is reported, never fatal
            _warn(f"GatewayAddress {id_}: not read ({why_not_read(exc)}); kept as recorded")
            return ReadResult(id_=id_, outs=props)
        addresses, pending = reach.addresses, sorted(reach.pending)
        if sorted(props.get("addresses") or []) == addresses and sorted(props.get("pending") or []) == pending:
            return ReadResult(id_=id_, outs=props)  # nothing changed: the record stays as it is
        why = f" ({reach.seen})" if reach.seen else (f" ({describe_pending(reach.pending)})" if pending else "")
        _warn(f"GatewayAddress {id_}: drift: reachable on {addresses or 'no address'}, recorded "
              f"{props.get('addresses')}{why}; the next up follows it")
        return ReadResult(id_=id_, outs={**props, "addresses": addresses, "pending": pending})


class GatewayAddress(TypedResource, module="kube", name="GatewayAddress"):
    """Outputs: addresses (the Gateway's reachable IPs, sorted as Cilium or the nodes report them);
    pending (member addresses not settled when the wait ended: waited for again at the next up)."""

    addresses: pulumi.Output[list]

    def __init__(self, resource_name: str, *, kubeconfig: pulumi.Input[str], namespace: str, name: str, mode: str,
                 setting: str, timeout: float, node_selector: dict | None = None, pool: bool = False,
                 fixed: str | None = None, trigger: pulumi.Input = None, members: pulumi.Input[list] | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        """setting: the stack-config path of the zone's ingress (`zones[0].ingress`), named on failure.
        members: the zone's member machines' addresses (host-network mode): only their Nodes serve."""
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "namespace": namespace, "name": name, "mode": mode,
                 "setting": setting, "timeout": timeout, "nodeSelector": dict(node_selector or {}), "pool": pool,
                 "fixed": fixed, "trigger": trigger, "members": members, "addresses": None, "pending": None}
        super().__init__(GatewayAddressProvider(), resource_name, props, with_secret_outputs(opts, "kubeconfig"))
