"""Hub inventory: Instance objects and the pools that claim them.

A claim is the label `kontinuum.sh/claimed-by=<pool>` written with a PUT that carries the
resourceVersion we read (compare-and-swap): of two pools racing for one machine, in one
`pulumi up` or in two stacks, exactly one write succeeds; the loser gets 409 Conflict and
moves on to the next candidate. Claims are sticky; only a scale-down releases, and it
releases the most recently claimed members (name-last among those claimed together), so the
outcome does not depend on timing and surviving members keep their slot (and with it the
machine config applied to them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.rest import ApiException

from kontinuum.errors import KontinuumError
from kontinuum.hub.crds import API_VERSION, GROUP, INSTANCE_KIND, LABEL_CLAIMED_BY, LABEL_LOST, VERSION
from kontinuum.hub.crds import INSTANCE_PLURAL as PLURAL
from kontinuum.kube.clients import api_client
REQUEST_TIMEOUT = 15.0  # seconds per hub API call
MAX_ROUNDS = 200  # claim/release rounds before giving up on a pathological race


class HubError(KontinuumError):
    """A hub API call failed; says which object and what to check."""


class InsufficientCapacity(KontinuumError):
    """Not enough unclaimed Instances match a pool's selector."""

    def __init__(self, pool: str, selector: dict[str, str], wanted: int, matched: int, holders: dict[str, int]):
        self.pool, self.selector, self.wanted, self.matched, self.holders = pool, selector, wanted, matched, holders
        self.state = PoolState()  # what the pool does hold, filled in by the claimer
        held = ", ".join(f"{n} by {p}" for p, n in sorted(holders.items())) or "none"
        sel = ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<everything>"
        super().__init__(
            f"pool {pool}: wants {wanted} instance(s) matching {sel}, but only {matched} match and the rest are "
            f"held elsewhere (held: {held}); add Instances with these labels, release them from the holding "
            "pool, or lower replicas"
        )


class MembersUnavailable(KontinuumError):
    """Named members of a pool could not be claimed."""

    def __init__(self, pool: str, problems: dict[str, str]):
        self.pool, self.problems = pool, problems
        listed = "; ".join(f"{n}: {p}" for n, p in problems.items())
        super().__init__(
            f"pool {pool}: cannot hold its member(s) ({listed}). A machine held by another pool is in use "
            "there: take it out of that pool's config (or release it) first, then run `pulumi up` again."
        )


@dataclass(frozen=True)
class Member:
    name: str
    address: str | None
    discovered: bool


@dataclass(frozen=True)
class PoolState:
    members: list[Member] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    @property
    def ready_replicas(self) -> int:
        return sum(1 for m in self.members if m.discovered)


def _labels(obj: dict) -> dict[str, str]:
    return obj.get("metadata", {}).get("labels") or {}


def _member(obj: dict) -> Member:
    status = obj.get("status") or {}
    return Member(obj["metadata"]["name"], status.get("address"), bool(status.get("discovered")))


def selector_string(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


class Inventory:
    """Instances on the hub, through the Kubernetes API of the hub."""

    def __init__(self, api: client.CustomObjectsApi, timeout: float = REQUEST_TIMEOUT):
        self.api = api
        self.timeout = timeout

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str, timeout: float = REQUEST_TIMEOUT) -> "Inventory":
        return cls(client.CustomObjectsApi(api_client(kubeconfig)), timeout)

    # -- plain object access ----------------------------------------------------------

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(GROUP, VERSION, PLURAL, *args, _request_timeout=self.timeout, **kwargs)
        except ApiException as e:
            if e.status in (404, 409):
                raise
            raise HubError(f"hub: {what} failed: HTTP {e.status} {e.reason}; check the hub kubeconfig and that "
                           "the kontinuum.sh CRDs are installed") from None
        except Exception as e:  # urllib3 connection and timeout errors
            raise HubError(f"hub: {what} failed: {e}; is the hub reachable from here?") from None

    def get(self, name: str) -> dict | None:
        try:
            return self._call(f"get Instance {name}", self.api.get_cluster_custom_object, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, selector: dict[str, str] | None = None) -> list[dict]:
        out = self._call("list Instances", self.api.list_cluster_custom_object,
                         label_selector=selector_string(selector or {}))
        return sorted(out.get("items", []), key=lambda o: o["metadata"]["name"])

    def register(self, name: str, interfaces: list[str], labels: dict[str, str]) -> dict:
        """Create the Instance or bring its spec and our labels up to date; a claim is kept. The
        lost mark is the registrant's: it goes when `labels` no longer carry it."""
        for _ in range(5):
            obj = self.get(name)
            if obj is None:
                body = {
                    "apiVersion": API_VERSION,
                    "kind": INSTANCE_KIND,
                    "metadata": {"name": name, "labels": dict(labels)},
                    "spec": {"interfaces": list(interfaces)},
                }
                try:
                    return self._call(f"create Instance {name}", self.api.create_cluster_custom_object, body)
                except ApiException as e:
                    if e.status == 409:
                        continue
                    raise
            stale = LABEL_LOST in _labels(obj) and LABEL_LOST not in labels
            if obj.get("spec", {}).get("interfaces") == list(interfaces) and not stale and all(
                _labels(obj).get(k) == v for k, v in labels.items()
            ):
                return obj
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
            if stale:
                obj["metadata"]["labels"].pop(LABEL_LOST)
            obj["spec"] = {**obj.get("spec", {}), "interfaces": list(interfaces)}
            try:
                return self._call(f"update Instance {name}", self.api.replace_cluster_custom_object, name, obj)
            except ApiException as e:
                if e.status != 409:
                    raise
        raise HubError(f"hub: Instance {name} kept changing under us; retry")

    def set_status(self, name: str, status: dict) -> dict:
        body = {"status": status}
        try:
            return self._call(f"update status of Instance {name}", self.api.patch_cluster_custom_object_status,
                              name, body)
        except ApiException as e:
            raise HubError(f"hub: Instance {name}: status update failed: HTTP {e.status}") from None

    def unregister(self, name: str) -> bool:
        try:
            self._call(f"delete Instance {name}", self.api.delete_cluster_custom_object, name)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise HubError(f"hub: delete Instance {name}: HTTP {e.status}") from None

    # -- claims -----------------------------------------------------------------------

    def _set_claim(self, obj: dict, pool: str | None) -> bool:
        """Compare-and-swap the claim label; False when someone else wrote first."""
        name = obj["metadata"]["name"]
        labels = dict(_labels(obj))
        if pool is None:
            labels.pop(LABEL_CLAIMED_BY, None)
        else:
            labels[LABEL_CLAIMED_BY] = pool
        body = {**obj, "metadata": {**obj["metadata"], "labels": labels}}  # keeps resourceVersion: the CAS guard
        try:
            self._call(f"claim Instance {name}", self.api.replace_cluster_custom_object, name, body)
            return True
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise HubError(f"hub: claim of Instance {name}: HTTP {e.status}") from None

    def claim(self, pool: str, selector: dict[str, str], replicas: int, *, wait: float = 0.0,
              interval: float = 2.0, order: list[str] | None = None) -> PoolState:
        """Hold exactly `replicas` Instances matching `selector` for `pool`.

        `order` is the pool's previous member list: survivors keep their position, new members
        are appended in name order, and a scale-down releases from the end. Waits up to `wait`
        seconds for capacity to appear, then raises InsufficientCapacity.
        """
        if replicas < 0:
            raise ValueError(f"pool {pool}: replicas must be >= 0, got {replicas}")
        deadline = time.monotonic() + wait
        while True:
            state, shortfall = self._claim_once(pool, selector, replicas, order or [])
            if shortfall is None:
                return state
            if time.monotonic() >= deadline:
                raise shortfall
            time.sleep(interval)

    def _claim_once(self, pool, selector, replicas, order) -> tuple[PoolState, InsufficientCapacity | None]:
        # Every round either wins a claim, loses one to another writer (the free set shrinks)
        # or releases one, so the number of rounds is bounded by the candidates involved.
        released: list[str] = []
        for _ in range(MAX_ROUNDS):
            items = self.list(selector)
            rank = {name: i for i, name in enumerate(order)}
            mine = sorted((o for o in items if _labels(o).get(LABEL_CLAIMED_BY) == pool),
                          key=lambda o: (rank.get(o["metadata"]["name"], len(rank)), o["metadata"]["name"]))
            if len(mine) > replicas:
                released += [o["metadata"]["name"] for o in mine[replicas:] if self._set_claim(o, None)]
                continue
            if len(mine) == replicas:
                return PoolState([_member(o) for o in mine], released), None
            free = [o for o in items if not _labels(o).get(LABEL_CLAIMED_BY)]
            if not free:
                holders: dict[str, int] = {}
                for o in items:
                    holder = _labels(o).get(LABEL_CLAIMED_BY)
                    if holder != pool:
                        holders[holder] = holders.get(holder, 0) + 1
                state = PoolState([_member(o) for o in mine], released)
                shortfall = InsufficientCapacity(pool, selector, replicas, len(items), holders)
                shortfall.state = state
                return state, shortfall
            for obj in free[: replicas - len(mine)]:
                self._set_claim(obj, pool)
        raise HubError(f"hub: pool {pool}: claims kept conflicting for {MAX_ROUNDS} rounds; retry")

    def claim_named(self, pool: str, machines: dict[str, list[str]], labels: dict[str, str], *,
                    wait: float = 0.0, interval: float = 2.0) -> PoolState:
        """Hold exactly the Instances named in `machines` (name → interfaces) for `pool`:
        membership by identity, the stack config names the members. Any other Instance the
        pool holds is released; a named one deleted out of band is registered again (with
        `labels`), so a running member keeps its place. Waits up to `wait` seconds for a
        member held elsewhere, then raises MembersUnavailable naming each one and its holder."""
        names = list(machines)
        deadline = time.monotonic() + wait
        while True:
            for name in names:
                if self.get(name) is None:
                    self.register(name, machines[name], labels)
            released = [o["metadata"]["name"] for o in self.list({LABEL_CLAIMED_BY: pool})
                        if o["metadata"]["name"] not in names and self._set_claim(o, None)]
            held, problems = [], {}
            for name in names:
                obj = self.get(name)
                holder = _labels(obj).get(LABEL_CLAIMED_BY) if obj else None
                if obj is None:
                    problems[name] = "deleted while claiming it"
                elif holder in (None, "", pool):
                    if holder == pool or self._set_claim(obj, pool):
                        held.append(name)
                    else:
                        problems[name] = "changed while claiming it"
                else:
                    problems[name] = f"held by pool {holder}"
            if not problems:
                members = {m.name: m for m in self.members(pool)}
                return PoolState([members[n] for n in names if n in members], released)
            if time.monotonic() >= deadline:
                raise MembersUnavailable(pool, problems)
            time.sleep(interval)

    def release(self, pool: str, selector: dict[str, str] | None = None) -> list[str]:
        """Drop every claim `pool` holds; returns the released names."""
        released = []
        for _ in range(MAX_ROUNDS):
            mine = self.list({**(selector or {}), LABEL_CLAIMED_BY: pool})
            if not mine:
                return released
            released += [o["metadata"]["name"] for o in mine if self._set_claim(o, None)]
        raise HubError(f"hub: pool {pool}: release kept conflicting; retry")

    def members(self, pool: str) -> list[Member]:
        return [_member(o) for o in self.list({LABEL_CLAIMED_BY: pool})]
