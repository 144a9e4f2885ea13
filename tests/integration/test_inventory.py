"""Hub inventory claims against a real kube-apiserver with our CRDs: races, scale, capacity."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import pytest

from kontinuum.hub.crds import LABEL_CLAIMED_BY
from kontinuum.hub.inventory import InsufficientCapacity, Inventory
from lab.hub import Hub


@pytest.fixture(scope="module")
def hub(tools_bin, tmp_path_factory):
    h = Hub.on_free_ports(tmp_path_factory.mktemp("hub"), "127.0.0.3").start()
    yield h
    h.stop()


@pytest.fixture
def inv(hub):
    return Inventory.from_kubeconfig(hub.kubeconfig)


def _make(inv: Inventory, prefix: str, n: int, **labels) -> list[str]:
    names = [f"{prefix}-{i:02d}" for i in range(n)]
    for name in names:
        inv.register(name, [f"127.0.9.{i + 1}" for i in range(2)], {"test": prefix, **labels})
    return names


def _claimer(kubeconfig, pool, jobs, results, barrier):
    inv = Inventory.from_kubeconfig(kubeconfig)
    while (job := jobs.get()) is not None:
        selector, replicas = job
        barrier.wait(timeout=60)
        try:
            got = inv.claim(pool, selector, replicas).members
        except InsufficientCapacity as e:
            got = e.state.members
        results.put((pool, sorted(m.name for m in got)))


def test_two_processes_never_double_claim(inv, hub):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    queues = {p: ctx.Queue() for p in ("pool-a", "pool-b")}
    procs = [ctx.Process(target=_claimer, args=(hub.kubeconfig, p, q, results, barrier), daemon=True)
             for p, q in queues.items()]
    for p in procs:
        p.start()
    try:
        for trial in range(50):
            capacity = 1 + trial % 4
            demand = {"pool-a": 1 + trial % 3, "pool-b": 1 + (trial // 3) % 3}
            prefix = f"race{trial}"
            names = _make(inv, prefix, capacity)
            for pool, q in queues.items():
                q.put(({"test": prefix}, demand[pool]))
            got = dict(results.get(timeout=120) for _ in queues)
            assert not set(got["pool-a"]) & set(got["pool-b"]), f"trial {trial}: double claim {got}"
            assert len(got["pool-a"]) + len(got["pool-b"]) == min(capacity, sum(demand.values())), got
            on_hub = {n: (inv.get(n)["metadata"].get("labels") or {}).get(LABEL_CLAIMED_BY) for n in names}
            for pool, members in got.items():
                assert sorted(n for n, holder in on_hub.items() if holder == pool) == members
    finally:
        for q in queues.values():
            q.put(None)
        for p in procs:
            p.join(timeout=30)


def test_scale_down_releases_name_last_and_scale_up_reclaims(inv):
    names = _make(inv, "scale", 3)
    assert [m.name for m in inv.claim("pool-s", {"test": "scale"}, 3).members] == names
    state = inv.claim("pool-s", {"test": "scale"}, 1)
    assert [m.name for m in state.members] == names[:1]
    assert state.released == names[1:]
    assert [m.name for m in inv.claim("pool-s", {"test": "scale"}, 3).members] == names


def test_claims_are_sticky_and_survive_register(inv):
    names = _make(inv, "sticky", 2)
    inv.claim("pool-x", {"test": "sticky"}, 1)
    inv.register(names[0], ["127.0.9.9"], {"test": "sticky"})  # re-register must keep the claim
    assert [m.name for m in inv.claim("pool-y", {"test": "sticky"}, 1).members] == names[1:]
    assert [m.name for m in inv.members("pool-x")] == names[:1]


def test_insufficient_capacity_names_selector_and_holders(inv):
    _make(inv, "short", 2)
    inv.claim("holder", {"test": "short"}, 1)
    with pytest.raises(InsufficientCapacity) as e:
        inv.claim("wanting", {"test": "short"}, 3)
    msg = str(e.value)
    assert "test=short" in msg and "wants 3" in msg and "only 2 match" in msg and "1 by holder" in msg


def test_wait_for_capacity_is_bounded(inv):
    _make(inv, "late", 1)
    later = threading.Timer(1.0, lambda: inv.register("late-99", ["127.0.9.1"], {"test": "late"}))
    later.start()
    t0 = time.monotonic()
    state = inv.claim("pool-late", {"test": "late"}, 2, wait=30, interval=0.3)
    assert len(state.members) == 2 and time.monotonic() - t0 < 30
    t0 = time.monotonic()
    with pytest.raises(InsufficientCapacity):
        inv.claim("pool-late", {"test": "late"}, 3, wait=1.5, interval=0.3)
    assert time.monotonic() - t0 < 5


def test_release_and_unregister(inv):
    names = _make(inv, "rel", 2)
    inv.claim("pool-r", {"test": "rel"}, 2)
    assert sorted(inv.release("pool-r")) == names
    assert inv.members("pool-r") == []
    assert inv.unregister(names[0]) and inv.get(names[0]) is None
    assert not inv.unregister(names[0])


def test_members_keep_their_slot_across_scale_up_and_down(inv):
    inv.register("slot-b", ["127.0.9.2"], {"test": "slot"})
    first = [m.name for m in inv.claim("pool-slot", {"test": "slot"}, 1).members]
    assert first == ["slot-b"]
    for name in ("slot-a", "slot-c"):
        inv.register(name, ["127.0.9.1"], {"test": "slot"})
    grown = [m.name for m in inv.claim("pool-slot", {"test": "slot"}, 3, order=first).members]
    assert grown == ["slot-b", "slot-a", "slot-c"]  # survivors first, newcomers in name order
    shrunk = inv.claim("pool-slot", {"test": "slot"}, 1, order=grown)
    assert [m.name for m in shrunk.members] == ["slot-b"] and shrunk.released == ["slot-a", "slot-c"]


def test_the_lost_mark_follows_the_registrant_and_keeps_the_claim(inv):
    from kontinuum.hub.crds import LABEL_LOST

    (name,) = _make(inv, "lost", 1)
    inv.claim("pool-lost", {"test": "lost"}, 1)
    inv.register(name, ["127.0.9.1", "127.0.9.2"], {"test": "lost", LABEL_LOST: "true"})
    assert inv.get(name)["metadata"]["labels"][LABEL_LOST] == "true"
    inv.register(name, ["127.0.9.1", "127.0.9.2"], {"test": "lost"})  # no longer declared lost
    labels = inv.get(name)["metadata"]["labels"]
    assert LABEL_LOST not in labels and labels[LABEL_CLAIMED_BY] == "pool-lost"
