"""State that emulated nodes of one cluster share: bootstrap, etcd membership, health probes.

A cluster is identified by its key (machineconfig.cluster_key_of: cluster.id, else the OS CA).
All nodes of one Lab share one registry, so a bootstrap on one control plane is seen by the
others and EtcdMemberList agrees across them, as etcd would.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterable, Optional, Protocol, TypeVar

from kontinuum.talos.pki import CertKey
from lab.talos_node import dial, etcd_service


class ClusterNode(Protocol):
    """What the registry reads of a node, which it never calls into (node.EmulatedNode fits)."""

    address: str
    port: int
    mode: str

    @property
    def hostname(self) -> str: ...

    @property
    def cluster_key(self) -> str | None: ...

    @property
    def is_control_plane(self) -> bool: ...

    @property
    def is_up(self) -> bool: ...


Node = TypeVar("Node", bound=ClusterNode)


@dataclass(frozen=True)
class Member:
    id: int
    hostname: str
    address: str

    @property
    def peer_urls(self) -> list[str]:
        return [f"https://{self.address}:2380"]

    @property
    def client_urls(self) -> list[str]:
        return [f"https://{self.address}:2379"]


@dataclass(frozen=True)
class HealthQuery:
    """What a health probe is asked about: the nodes named in the HealthCheck request (or,
    when it names none, the cluster's configured nodes)."""

    cluster_key: str
    control_plane_nodes: tuple[str, ...]
    worker_nodes: tuple[str, ...]
    force_endpoint: str = ""


# A probe returns (check name, problem) pairs in order; problem None means the check passes.
HealthProbe = Callable[[HealthQuery], Iterable[tuple[str, Optional[str]]]]


class AlreadyBootstrapped(Exception):
    pass


@dataclass
class ClusterState:
    key: str
    bootstrapped: bool = False  # etcd has quorum (False again once a wipe loses it)
    members: dict[int, Member] = field(default_factory=dict)  # the membership, as etcd lists it
    generation: int = 0  # bumped by every bootstrap: a new etcd, so a new control plane
    recover_from: bytes | None = None  # the snapshot a Bootstrap(recover_etcd) restores etcd from
    skip_hash_check: bool = False
    data: set[str] = field(default_factory=set)  # addresses whose EPHEMERAL holds this etcd's data
    removed: set[str] = field(default_factory=set)  # of those, members removed by ID: their etcd exits

    def standing(self, address: str) -> str:
        """etcd_service.MEMBER, REMOVED or NONE for the control plane at `address`."""
        if address in self.removed:
            return etcd_service.REMOVED
        if any(m.address == address for m in self.members.values()):
            return etcd_service.MEMBER
        return etcd_service.NONE


# Reads the cluster's real etcd snapshot (the lab's control plane registers it); blocking.
EtcdSnapshotter = Callable[[], bytes]


class ClusterRegistry(Generic[Node]):
    """Thread-safe: node handlers run on the lab's loop, tests read from their own thread.
    Hands back the nodes it was given (`Node`: EmulatedNode in the lab)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._clusters: dict[str, ClusterState] = {}
        self._probes: dict[str, HealthProbe] = {}
        self._issuers: dict[str, CertKey] = {}
        self._nodes: dict[str, Node] = {}
        self._bootstrap_listeners: list[Callable[[str], None]] = []
        self._etcd: dict[str, EtcdSnapshotter] = {}
        self._k8s_chains: dict[str, bytes] = {}

    # --- nodes --------------------------------------------------------------------------

    def add_node(self, node: Node) -> None:
        with self._lock:
            if node.address in self._nodes:
                raise ValueError(f"an emulated node already uses {node.address}")
            self._nodes[node.address] = node

    def remove_node(self, node: Node) -> None:
        with self._lock:
            self._nodes.pop(node.address, None)

    def node(self, address_or_hostname: str) -> Node | None:
        with self._lock:
            if address_or_hostname in self._nodes:
                return self._nodes[address_or_hostname]
            return next((n for n in self._nodes.values() if n.hostname == address_or_hostname), None)

    def nodes_of(self, key: str) -> list[Node]:
        """Nodes currently holding a config of cluster `key` (up or rebooting)."""
        with self._lock:
            return [n for n in self._nodes.values() if n.cluster_key == key]

    # --- trustd: workers get their apid certificate from a control plane ---------------

    def remember_issuer(self, key: str, os_ca: CertKey) -> None:
        with self._lock:
            self._issuers[key] = os_ca

    def issuer(self, key: str) -> CertKey | None:
        with self._lock:
            return self._issuers.get(key)

    # --- bootstrap and etcd -------------------------------------------------------------

    def state(self, key: str) -> ClusterState:
        """A snapshot of the cluster (empty when it has no state yet)."""
        with self._lock:
            state = self._clusters.get(key, ClusterState(key))
            return ClusterState(state.key, state.bootstrapped, dict(state.members), state.generation,
                                state.recover_from, state.skip_hash_check, set(state.data), set(state.removed))

    def bootstrapped(self) -> list[str]:
        """Keys of the clusters that are bootstrapped now (what the lab runs control planes for)."""
        with self._lock:
            return [key for key, state in self._clusters.items() if state.bootstrapped]

    def on_bootstrap(self, listener: Callable[[str], None]) -> None:
        """Call `listener(cluster_key)` right after a cluster is bootstrapped, before the
        Bootstrap call returns (the lab uses it to start the cluster's control plane). It runs on
        the emulator's loop thread: it must return at once and never call back into a node."""
        with self._lock:
            self._bootstrap_listeners.append(listener)

    def bootstrap(self, key: str, node: Node, *, recover_from: bytes | None = None,
                  skip_hash_check: bool = False) -> None:
        """Start etcd on `node` (from `recover_from`, an uploaded snapshot, if given); the other
        configured control planes of the cluster join it. A node still holding etcd data, or a
        cluster whose etcd runs, refuses (Talos: the etcd data directory is not empty)."""
        with self._lock:
            state = self._clusters.setdefault(key, ClusterState(key))
            if state.bootstrapped or any(m.address == node.address for m in state.members.values()):
                raise AlreadyBootstrapped(key)
            state.bootstrapped = True
            state.members.clear()  # whatever data others kept belongs to the lost etcd
            state.data.clear()
            state.generation += 1
            state.recover_from, state.skip_hash_check = recover_from, skip_hash_check
            self._join_locked(state, node)
            for other in self.nodes_of(key):
                if other is not node and other.is_control_plane and other.is_up:
                    self._join_locked(state, other)
            listeners = list(self._bootstrap_listeners)
        for listener in listeners:
            listener(key)

    def join(self, key: str, node: Node) -> None:
        """A control plane booted with this cluster's config joins etcd once it is bootstrapped."""
        with self._lock:
            state = self._clusters.get(key)
            if state and state.bootstrapped:
                self._join_locked(state, node)

    @staticmethod
    def _join_locked(state: ClusterState, node: Node) -> None:
        """Start etcd on `node`: on its own data if it has some, else as a new member (Talos's
        addMember first removes a member of the same name: the one a wipe left behind). A node
        whose member was removed does not come back (etcd_service)."""
        if node.address in state.removed:
            return
        if node.address in state.data and any(m.address == node.address for m in state.members.values()):
            return
        for stale in [i for i, m in state.members.items() if node.address == m.address or node.hostname == m.hostname]:
            del state.members[stale]
        member_id = secrets.randbits(63) | 1
        state.members[member_id] = Member(member_id, node.hostname, node.address)
        state.data.add(node.address)

    def leave(self, key: str, address: str) -> bool:
        """The node's member leaves and its etcd data is deleted (EtcdLeaveCluster, graceful reset)."""
        with self._lock:
            state = self._clusters.get(key)
            if not state:
                return False
            ids = [i for i, m in state.members.items() if m.address == address]
            for i in ids:
                del state.members[i]
            state.data.discard(address)
            state.removed.discard(address)
            return bool(ids)

    def has_quorum(self, key: str) -> bool:
        """A majority of the members' machines run etcd: a member whose machine crashed, is off or
        is rebooting does not answer, and without a majority etcd has no leader (every member
        then reports itself unhealthy, as a real etcd's health check does)."""
        with self._lock:
            state = self._clusters.get(key)
            if state is None or not state.bootstrapped:
                return False
            return self._members_up(state) * 2 > len(state.members)

    def _members_up(self, state: ClusterState) -> int:
        """Members whose machine runs (not crashed, off or rebooting); call with the lock held."""
        return sum(1 for m in state.members.values()
                   if (n := self._nodes.get(m.address)) is not None and n.mode in ("configured", "booting"))

    def etcd_standing(self, key: str, address: str) -> str:
        """etcd_service.MEMBER, REMOVED or NONE: what the node's etcd service can do."""
        with self._lock:
            state = self._clusters.get(key)
            return state.standing(address) if state else etcd_service.NONE

    def drop_data(self, key: str, address: str) -> None:
        """The node's EPHEMERAL was wiped but its member is left behind (a reset that wiped
        STATE too, so the node comes back unconfigured): it would join afresh."""
        with self._lock:
            state = self._clusters.get(key)
            if state:
                state.data.discard(address)
                state.removed.discard(address)

    def wipe_etcd(self, key: str, address: str) -> None:
        """The node's EPHEMERAL partition (its etcd data) was wiped. Its member is gone; when
        that leaves fewer members than a quorum of the cluster before, etcd is lost: the
        cluster is no longer bootstrapped (the lab stops its control plane) until a Bootstrap,
        with recover_etcd for a disaster recovery."""
        with self._lock:
            state = self._clusters.get(key)
            if not state:
                return
            before = len(state.members)
            ids = [i for i, m in state.members.items() if m.address == address]
            for i in ids:
                del state.members[i]
            state.data.discard(address)
            state.removed.discard(address)
            # Only members whose machines run can keep the quorum: a wipe beside crashed members
            # loses etcd as surely as wiping them (the wiped node then waits, Preparing).
            if ids and state.bootstrapped and self._members_up(state) < before // 2 + 1:
                state.bootstrapped = False

    def set_etcd(self, key: str, snapshotter: EtcdSnapshotter | None) -> None:
        """The lab registers how to read the cluster's real etcd (None: it stopped)."""
        with self._lock:
            if snapshotter is None:
                self._etcd.pop(key, None)
            else:
                self._etcd[key] = snapshotter

    def set_k8s_chain(self, key: str, chain: bytes) -> None:
        """The lab's control plane of `key` runs on this cluster CA chain (ca + acceptedCAs) now."""
        with self._lock:
            self._k8s_chains[key] = chain

    def k8s_chain(self, key: str) -> bytes | None:
        with self._lock:
            return self._k8s_chains.get(key)

    def etcd(self, key: str) -> EtcdSnapshotter | None:
        with self._lock:
            return self._etcd.get(key)

    def remove_member(self, key: str, member_id: int) -> bool:
        """EtcdRemoveMemberByID. A node that still holds that member's data cannot run etcd on
        it any more, whether it runs now or boots later (etcd_service: REMOVED)."""
        with self._lock:
            state = self._clusters.get(key)
            member = state.members.pop(member_id, None) if state else None
            if member is None:
                return False
            if member.address in state.data:
                state.removed.add(member.address)
            return True

    def forget_if_empty(self, key: str) -> None:
        """When no node holds the cluster's config any more, its etcd data is gone too."""
        with self._lock:
            if not self.nodes_of(key):
                self._clusters.pop(key, None)
                self._issuers.pop(key, None)

    # --- health -------------------------------------------------------------------------

    def set_health_probe(self, key: str, probe: HealthProbe | None) -> None:
        """Add checks (e.g. Kubernetes readiness from the lab's control plane) that HealthCheck
        runs after the emulator's own Talos-level checks for cluster `key`; None removes them."""
        with self._lock:
            if probe is None:
                self._probes.pop(key, None)
            else:
                self._probes[key] = probe

    def health(self, query: HealthQuery) -> list[tuple[str, str | None]]:
        """Talos-level checks, then the registered probe's; blocking (run it off the loop)."""
        checks = self._talos_checks(query)
        with self._lock:
            probe = self._probes.get(query.cluster_key)
        if probe is not None:
            checks += list(probe(query))
        return checks

    def _talos_checks(self, query: HealthQuery) -> list[tuple[str, str | None]]:
        state = self.state(query.cluster_key)
        expected = (*query.control_plane_nodes, *query.worker_nodes)

        def problems(nodes: Iterable[str], test: Callable[[Node | None], str | None]) -> str | None:
            found = [f"{a}: {p}" for a in nodes if (p := test(self.node(a)))]
            return "; ".join(found) or None

        def apid(node: Node | None) -> str | None:
            if node is None or not node.is_up:
                return "apid is not reachable"
            if node.cluster_key != query.cluster_key:
                return "node is not a member of this cluster"
            return None

        def booted(node: Node | None) -> str | None:
            return None if node is not None and node.mode == "configured" else "boot sequence has not finished"

        def etcd(address: str) -> str | None:
            # Talos asks each control plane's etcd service through the node running the check.
            node = self.node(address)
            if node is None or not node.is_up:
                crashed = node is not None and node.mode == "crashed"
                port = node.port if node is not None else 50000
                return dial.rpc_error((dial.timed_out if crashed else dial.refused)(address, port))
            if node.cluster_key != query.cluster_key or not node.is_control_plane:
                return None  # the apid and membership checks name it
            return etcd_service.health_problem(state.standing(address), bootstrapped=state.bootstrapped)

        etcd_problem = "etcd is not bootstrapped yet"
        if state.bootstrapped:
            etcd_problem = "; ".join(f"{a}: {p}" for a in query.control_plane_nodes if (p := etcd(a))) or None
        member_addresses = {m.address for m in state.members.values()}
        missing = sorted(set(query.control_plane_nodes) - member_addresses)
        extra = sorted(member_addresses - set(query.control_plane_nodes))
        members_problem = None
        if missing or extra:
            members_problem = f"etcd members {sorted(member_addresses)} do not match control plane nodes {sorted(query.control_plane_nodes)}"
        return [
            ("etcd to be healthy", etcd_problem),
            ("etcd members to be control plane nodes", members_problem),
            ("apid to be ready", problems(expected, apid)),
            ("all nodes to finish boot sequence", problems(expected, booted)),
        ]
