"""Is etcd healthy with every member? Read through the Talos API, the gate before a control
plane goes down (upgrade, removal) and after one comes back (DESIGN §10).

Healthy means: the member list answers, every expected control plane is a member, and every
member's node reports its etcd service Running and healthy. The problem names the member.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable
from urllib.parse import urlsplit

from kontinuum.errors import KontinuumError
from kontinuum.talos.answers import EtcdMember, ServiceStatus
from kontinuum.talos.errors import TalosError
from kontinuum.talos.waits import NotYet, WaitTimeout, wait_until

if TYPE_CHECKING:  # callers hand in their clients: planning a gate needs no gRPC
    from kontinuum.talos.client import TalosClient

ClientFor = Callable[[str], "TalosClient"]


class EtcdUnhealthyError(KontinuumError):
    pass


def member_address(member: EtcdMember) -> str:
    for url in (*member.peer_urls, *member.client_urls):
        host = urlsplit(url).hostname
        if host:
            return host
    return member.hostname


def running_healthy(services: Iterable[ServiceStatus]) -> bool:
    """The node's etcd service is Running and healthy (ServiceList)."""
    etcd = next((s for s in services if s.id == "etcd"), None)
    return etcd is not None and etcd.state == "Running" and etcd.healthy is True


def members(client_for: ClientFor, control_planes: Iterable[str], left: float) -> list[EtcdMember]:
    """The member list, from the first control plane that answers."""
    last = "no control plane listed"
    for address in control_planes:
        client = client_for(address)
        try:
            return client.etcd_members(timeout=min(left, client.deadlines.etcd))
        except TalosError as e:
            last = e.problem
    raise NotYet(f"no control plane answered the etcd member list ({last})")


def problem(client_for: ClientFor, control_planes: list[str], left: float) -> str | None:
    """None when etcd is healthy with every member, else what is wrong, naming the member."""
    try:
        found = members(client_for, control_planes, left)
    except NotYet as e:
        return e.observation
    by_address = {member_address(m): m for m in found}
    missing = [a for a in control_planes if a not in by_address]
    if missing:
        return f"control plane(s) {', '.join(missing)} are not etcd members (members: {sorted(by_address)})"
    problems = []
    for address, m in sorted(by_address.items()):
        name = f"etcd member {m.hostname} ({address})"
        if m.is_learner:
            problems.append(f"{name} is still a learner")
            continue
        client = client_for(address)
        try:
            services = client.service_list(timeout=min(left, client.deadlines.service_list))
        except TalosError as e:
            problems.append(f"{name} does not answer: {e.problem}")
            continue
        if not running_healthy(services):
            etcd = next((s for s in services if s.id == "etcd"), None)
            state = "absent" if etcd is None else f"{etcd.state}, healthy={etcd.healthy}"
            problems.append(f"{name} is not healthy (etcd service: {state})")
    return "; ".join(problems) or None


def wait_healthy(client_for: ClientFor, control_planes: list[str], *, timeout: float, why: str) -> None:
    """Wait (bounded) until etcd is healthy with every member; EtcdUnhealthyError names the member."""

    def probe(left: float) -> None:
        if (p := problem(client_for, control_planes, left)) is not None:
            raise NotYet(p)

    try:
        wait_until(f"etcd to be healthy with every member {why}", probe, timeout=timeout, remedy="")
    except WaitTimeout as e:
        raise EtcdUnhealthyError(
            f"etcd is not healthy with every member {why}: {e.last} (waited {timeout:g} s). Nothing was done; "
            "bring that member back (check its node and etcd service), then run "
            "`pulumi up` again.") from None
