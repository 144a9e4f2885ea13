"""Day 2 through the real engine (issue 17): control-plane scaling and rolling Talos upgrades of
one live zone, by editing the stack config and running `pulumi up`.

One lab for the module (nodes 127.0.41.11+, hub 127.0.0.41) and one zone that lives through
the whole module, its endpoint 127.0.41.10: no machine's address, so the lab serves it as the
load balancer an operator puts in front of an HA zone's control planes (each control plane runs
its own apiserver, down while its machine reboots). In order: 1 control plane + 2 workers → 3 control planes (API polled
throughout) → a patch that needs a reboot (the preview names the waves; each node reboots only
after the one before it is Ready again, control planes first, API polled throughout) → a live
patch (every node at once, no reboot) → Talos v1.13.1 (strict one-at-a-time order, control
planes first, a node slow to be Ready holds the next one back, second up a no-op) → preview shows
the plan and refuses a downgrade → v1.13.2 with an A/B rollback on the second node (stops there;
the next up stops at a worker whose installer cannot be pulled, nothing cordoned; the one after
finishes) → v1.13.3 killed mid-rollout (the re-run
upgrades no node twice) → Kubernetes v1.35.4 → v1.35.5 (upgrade-k8s's order: the target images
pre-pulled first, each control plane's apiserver, controller-manager, scheduler, one node at a
time, then every kubelet, then the bootstrap manifests; the second up a no-op) → v1.35.6 killed
(SIGKILL) after the first control plane's apiserver moved (the re-run converges, no component
applied twice) → v1.36.0 with a patch setting a feature gate 1.36 removes (preview and up refuse
it, naming the gate, no node touched) → back to 1 control plane (API polled throughout). The emulator's event log
(every node's upgrade call, reboot and boot, and the lab kubelets' static-pod and kubelet
changes, globally ordered) is the proof.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from kubernetes import client

from kontinuum.kube.clients import api_client
from lab.pulumi_cli import ROOT, kill_strays
from lab.talos_node import control
from tests.e2e.cluster_lab import TIMEOUTS, new_stack, output, ready, up_in_background, write_config
from tests.e2e.labs import running_lab

FIRST, HUB = "127.0.41.11", "127.0.0.41"
CPS = ["127.0.41.11", "127.0.41.12", "127.0.41.13"]
WORKERS = ["127.0.41.14", "127.0.41.15"]
ORDER = CPS + WORKERS
ENDPOINT = "https://127.0.41.10:6443"  # a load balancer over the control planes (the lab serves it)
K8S_OLD, K8S_NEW, K8S_KILLED = "v1.35.4", "v1.35.5", "v1.35.6"
KUBELET_DELAY = 0.5  # the lab's default: seconds from a node's boot to its kubelet starting
K8S_NEXT_MINOR, REMOVED_GATE = "v1.36.0", "WatchFromStorageWithoutResourceVersion"  # go-kubernetes' 1.35->1.36
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab"), nodes=len(ORDER), first_address=FIRST, hub_address=HUB) as state:
        yield state


PATCHES: list = []  # the zone's config patches: set by the config rollout tests, kept by every later config


def zone(replicas: int, talos: str = "v1.13.0", **extra) -> dict:
    machines = [{"address": a, "pool": "controlplane"} for a in CPS] + [{"address": a, "pool": "web"} for a in WORKERS]
    return {"zone": "d2", "talosAddresses": machines, "controlPlane": {"replicas": replicas, "endpoint": ENDPOINT},
            "workers": [{"name": "web", "replicas": len(WORKERS)}], "talosVersion": talos, "patches": list(PATCHES),
            # upgrade: per node (drain, install, 1 s reboot, etcd gates): 60 s ran out under CI load
            "timeouts": {**TIMEOUTS, "upgrade": 180}, **extra}


@pytest.fixture(scope="module")
def d2(lab, tmp_path_factory):
    stack = new_stack(tmp_path_factory.mktemp("d2"), lab, zone(1))
    return stack, lab


def configure(d2, z: dict) -> None:
    write_config(d2[0], d2[1], z)


def log_of(addresses=ORDER) -> list[dict]:
    """Every node's event log, in global order."""
    return sorted((e for a in addresses for e in control.read_state(a)["events"]), key=lambda e: e["seq"])


def calls(addresses=ORDER) -> dict[str, dict[str, int]]:
    return {a: dict(control.read_state(a)["calls"]) for a in addresses}


def since(before: dict, after: dict, method: str) -> dict[str, int]:
    return {a: after[a].get(method, 0) - before[a].get(method, 0) for a in after}


def versions() -> dict[str, str]:
    return {a: control.read_state(a)["talos_version"] for a in ORDER}


class ApiPoller:
    """Polls the zone's API server (GET /version) every 0.2 s from a thread; counts failures.
    An API that is down refuses at once; each request may take up to 10 s, because a CPU-starved
    machine (modules in parallel on 2 cores) answers slowly, which is not an outage."""

    def __init__(self, kubeconfig: str):
        self.api = api_client(kubeconfig)
        self.ok = self.failed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.2):
            try:
                client.VersionApi(self.api).get_code(_request_timeout=10)
                self.ok += 1
            except Exception as e:  # noqa: BLE001 - counted and reported
                self.failed += 1
                self.errors.append(str(e)[:200])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self.api.close()


def kubeconfig(stack) -> str:
    return stack.outputs(show_secrets=True)["kubeconfigs"]["d2"]


def etcd_members(stack) -> list[str]:
    """The zone's etcd members as the lab's etcd (the emulator's cluster registry) has them."""
    return control.read_state(CPS[0])["etcd_members"]


# --- scaling up ----------------------------------------------------------------------------------



def up_killed_once(stack, log_name: str, never: str, happened, timeout: float = 180) -> None:
    """Start `pulumi up`, SIGKILL it (and its plugins) as soon as `happened()`; `never` is the
    failure when it does not within `timeout` or the up ends first."""
    proc = up_in_background(stack, stack.state_dir.parent / log_name)
    try:
        deadline = time.monotonic() + timeout
        while not happened():
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, never
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        kill_strays(ROOT, stack.state_dir)

def test_zone_with_one_control_plane_comes_up(d2):
    stack, _ = d2
    stack.up()
    assert ready(stack, "d2")
    assert all(control.read_state(a)["mode"] == "configured" for a in [CPS[0], *WORKERS])
    assert control.read_state(CPS[1])["mode"] == "maintenance"


def test_scale_up_to_three_joins_one_at_a_time_api_answering(d2):
    stack, _ = d2
    if not ready(stack, "d2"):
        pytest.skip("the zone did not come up")
    configure(d2, zone(3))
    before = calls()
    with ApiPoller(kubeconfig(stack)) as poll:
        stack.up()
    assert poll.failed == 0 and poll.ok > 10, poll.errors[:3]
    assert ready(stack, "d2") and etcd_members(stack) == sorted(CPS)
    boots = [(e["node"], e["event"]) for e in log_of(CPS[1:]) if e["event"] == "booted" and e["mode"] == "configured"]
    assert [n for n, _ in boots] == CPS[1:], boots  # the second joined (and was healthy) before the third began
    after = calls()
    assert all(since(before, after, m)[w] == 0 for w in WORKERS for m in ("Reset", "Upgrade")), after


# --- config changes: live ones at once, reboots one node at a time ---------------------------------

REBOOT_PATCH = [{"op": "add", "path": "/machine/env", "value": {"E2E_ROLLOUT": "1"}}]  # Talos 1.13: needs a reboot
LIVE_PATCH = [{"op": "add", "path": "/machine/sysctls", "value": {"net.core.somaxconn": "4096"}}]  # applies live


def assert_each_waits_for_the_previous_ready(events: list[dict]) -> None:
    """No node goes down before the one before it is ready again: its Node Ready after its boot."""
    down = None
    for e in events:
        if e["event"] == "reboot":
            assert down is None, f"{e['node']} went down while {down} was not ready again"
            down = e["node"]
        elif e["event"] == "node-ready" and e["node"] == down:
            down = None
    assert down is None, f"{down} never became ready again"


def reboots(events: list[dict]) -> list[str]:
    return [e["node"] for e in events if e["event"] == "reboot"]


def test_a_patch_that_needs_a_reboot_rolls_one_node_at_a_time_api_answering(d2):
    stack, _ = d2
    if not ready(stack, "d2") or etcd_members(stack) != sorted(CPS):
        pytest.skip("the zone did not scale up")
    PATCHES[:] = [REBOOT_PATCH]
    configure(d2, zone(3))
    shown = output(stack.preview("--diff"))
    waves = [shown.index(f"wave {i}: reboot ") for i in range(1, 6)]
    assert waves == sorted(waves) and all(f"({a})" in shown for a in ORDER), shown[-3000:]
    start = log_of()[-1]["seq"]
    t0 = time.monotonic()
    with ApiPoller(kubeconfig(stack)) as poll:
        stack.up()
    elapsed = time.monotonic() - t0
    events = [e for e in log_of() if e["seq"] > start]
    assert reboots(events) == ORDER  # control planes first, then the workers, each once
    assert_each_waits_for_the_previous_ready(events)
    assert poll.failed == 0 and poll.ok > 10, poll.errors[:3]
    print(f"rolling reboot of {len(ORDER)} nodes: {elapsed:.1f} s")
    before = calls()
    stack.preview("--expect-no-changes")
    assert all(since(before, calls(), m) == {a: 0 for a in ORDER} for m in ("ApplyConfiguration", "Reboot"))


def test_a_live_patch_reaches_every_node_at_once_without_a_reboot(d2):
    stack, _ = d2
    if PATCHES != [REBOOT_PATCH]:
        pytest.skip("the rolling reboot did not run")
    PATCHES[:] = [REBOOT_PATCH, LIVE_PATCH]
    configure(d2, zone(3))
    start, before = log_of()[-1]["seq"], calls()
    stack.up()
    events = [e for e in log_of() if e["seq"] > start]
    assert reboots(events) == []
    assert since(before, calls(), "ApplyConfiguration") == {a: 1 for a in ORDER}
    assert nodes_schedulable(stack)


def nodes_schedulable(stack) -> bool:
    api = api_client(kubeconfig(stack))
    try:
        return not any(n.spec.unschedulable for n in client.CoreV1Api(api).list_node(_request_timeout=10).items)
    finally:
        api.close()


# --- the Talos upgrade -----------------------------------------------------------------------------


def upgrades(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["node"], e["event"]) for e in events if e["event"] in ("upgrade", "upgraded", "rolled-back")]


def test_talos_upgrade_rolls_one_node_at_a_time_control_planes_first(d2):
    stack, _ = d2
    if not ready(stack, "d2"):
        pytest.skip("the zone did not come up")
    configure(d2, zone(3, "v1.13.1"))
    start = log_of()[-1]["seq"]
    control.set_faults(CPS[1], kubelet_delay=3.0)  # slow to be Ready again: the next node must wait for it
    t0 = time.monotonic()
    try:
        stack.up()
    finally:
        control.set_faults(CPS[1], kubelet_delay=KUBELET_DELAY)
    elapsed = time.monotonic() - t0
    events = [e for e in log_of() if e["seq"] > start]
    assert upgrades(events) == [(a, k) for a in ORDER for k in ("upgrade", "upgraded")]
    assert_each_waits_for_the_previous_ready(events)
    ready_again = next(e["seq"] for e in events if e["event"] == "node-ready" and e["node"] == CPS[1])
    assert ready_again < next(e["seq"] for e in events if e["event"] == "upgrade" and e["node"] == CPS[2])
    assert versions() == {a: "v1.13.1" for a in ORDER}
    print(f"rollout of {len(ORDER)} nodes: {elapsed:.1f} s")
    before = calls()
    stack.up("--expect-no-changes")
    assert all(v == 0 for v in since(before, calls(), "Upgrade").values())


def test_preview_shows_the_plan_and_refuses_a_downgrade(d2):
    stack, _ = d2
    if versions() != {a: "v1.13.1" for a in ORDER}:
        pytest.skip("the first rollout did not finish")
    before = calls()
    configure(d2, zone(3, "v1.13.2"))
    shown = output(stack.preview("--diff"))
    for i, a in enumerate(ORDER, 1):
        assert f"step {i}/5" in shown and f"({a}) v1.13.1 → v1.13.2" in shown, shown[-3000:]
    configure(d2, zone(3, "v1.13.0"))
    refused = stack.run("preview", check=False)
    text = output(refused)
    assert refused.returncode != 0 and "zones[0].talosVersion:" in text and "allowDowngrade" in text, text[-3000:]
    assert all(v == 0 for v in since(before, calls(), "Upgrade").values())
    assert all(v == 0 for v in since(before, calls(), "ApplyConfiguration").values())


def test_ab_rollback_stops_the_rollout_there_and_the_next_up_finishes(d2):
    stack, _ = d2
    if versions() != {a: "v1.13.1" for a in ORDER}:
        pytest.skip("the first rollout did not finish")
    configure(d2, zone(3, "v1.13.2"))
    control.set_faults(CPS[1], upgrade_fault="rollback")
    start = log_of()[-1]["seq"]
    try:
        failed = stack.run("up", "--yes", "--skip-preview", check=False)
    finally:
        control.set_faults(CPS[1], upgrade_fault="")
    text = output(failed)
    assert failed.returncode != 0
    assert f"({CPS[1]}) came back on Talos v1.13.1 instead of v1.13.2" in text and "A/B rollback" in text, text[-3000:]
    events = [e for e in log_of() if e["seq"] > start]
    assert upgrades(events) == [(CPS[0], "upgrade"), (CPS[0], "upgraded"), (CPS[1], "upgrade"), (CPS[1], "rolled-back")]
    # The next up meets an installer the first worker cannot pull: it stops there, that worker
    # neither cordoned nor rebooted; the one after that finishes.
    start = events[-1]["seq"]
    control.set_faults(WORKERS[0], pull_fault="installer")
    try:
        failed = stack.run("up", "--yes", "--skip-preview", check=False)
    finally:
        control.set_faults(WORKERS[0], pull_fault="")
    text = output(failed)
    assert failed.returncode != 0 and WORKERS[0] in text and "not found" in text, text[-3000:]
    events = [e for e in log_of() if e["seq"] > start]
    assert upgrades(events) == [(a, k) for a in ORDER[1:3] for k in ("upgrade", "upgraded")]
    assert WORKERS[0] not in reboots(events) and nodes_schedulable(stack)
    start = events[-1]["seq"]
    stack.up()
    events = [e for e in log_of() if e["seq"] > start]
    assert upgrades(events) == [(a, k) for a in WORKERS for k in ("upgrade", "upgraded")]
    assert versions() == {a: "v1.13.2" for a in ORDER}


def test_killed_mid_rollout_converges_without_upgrading_a_node_twice(d2):
    stack, _ = d2
    if versions() != {a: "v1.13.2" for a in ORDER}:
        pytest.skip("the earlier rollouts did not finish")
    configure(d2, zone(3, "v1.13.3"))
    for a in ORDER:
        control.set_faults(a, reboot_delay=3.0)  # a window to land the kill in
    start = log_of()[-1]["seq"]
    try:
        up_killed_once(stack, "kill-events.jsonl", "the second control plane never rebooted", lambda: any(
            e["event"] == "reboot" and e["node"] == CPS[1] and e["seq"] > start for e in log_of([CPS[1]])))
    finally:
        for a in ORDER:
            control.set_faults(a, reboot_delay=1.0)
    stack.up()
    events = [e for e in log_of() if e["seq"] > start]
    assert upgrades(events) == [(a, k) for a in ORDER for k in ("upgrade", "upgraded")]
    assert versions() == {a: "v1.13.3" for a in ORDER}
    stack.preview("--expect-no-changes")


# --- the Kubernetes upgrade -------------------------------------------------------------------------


def k8s_changes(events: list[dict]) -> list[tuple[str, str, str]]:
    """(node, component, version) of every static pod and kubelet the lab kubelets changed."""
    return [(e["node"], e.get("component", "kubelet"), (e.get("image") or e.get("version", "")).rsplit(":", 1)[-1])
            for e in events if e["event"] in ("static-pod", "kubelet")]


def test_kubernetes_upgrade_goes_component_by_component_node_by_node(d2):
    stack, _ = d2
    if versions() != {a: "v1.13.3" for a in ORDER}:
        pytest.skip("the Talos rollouts did not finish")
    configure(d2, zone(3, "v1.13.3", kubernetesVersion=K8S_NEW))
    start = log_of()[-1]["seq"]
    before = calls()
    t0 = time.monotonic()
    # The plan comes from the resource's diff, the same one a `pulumi preview` runs (the Talos
    # test above checks it there; this saves a run).
    shown = output(stack.up())
    elapsed = time.monotonic() - t0
    assert ("step 1/8: " in shown and f"({CPS[0]}) kube-apiserver, kube-controller-manager, kube-scheduler "
            f"{K8S_OLD} → {K8S_NEW}" in shown and "step 8/8: " in shown and f"({WORKERS[1]}) kubelet" in shown), shown[-3000:]
    events = [e for e in log_of() if e["seq"] > start]
    assert k8s_changes(events) == ([(cp, c, K8S_NEW) for cp in CPS for c in COMPONENTS]
                                   + [(n, "kubelet", K8S_NEW) for n in ORDER])
    assert not [e for e in events if e["event"] == "reboot"]
    # pre-pulled, each image once per node, before the first component moved
    pulls = [e for e in events if e["event"] == "pulled"]
    assert sorted((e["node"], e["image"].rsplit("/", 1)[1]) for e in pulls) == sorted(
        [(cp, f"{c}:{K8S_NEW}") for cp in CPS for c in COMPONENTS] + [(n, f"kubelet:{K8S_NEW}") for n in ORDER])
    assert pulls[-1]["seq"] < next(e["seq"] for e in events if e["event"] == "static-pod")
    applied = since(before, calls(), "ApplyConfiguration")
    # the rollout's one config per component, then the ConfigApply of the full config
    assert applied == {**{cp: 4 + 1 for cp in CPS}, **{w: 1 + 1 for w in WORKERS}}, applied
    api = api_client(kubeconfig(stack))
    try:
        core = client.CoreV1Api(api)
        pods = core.list_namespaced_pod("kube-system", label_selector="tier=control-plane", _request_timeout=10).items
        assert sorted((p.status.host_ip, p.metadata.labels["k8s-app"], p.spec.containers[0].image) for p in pods) == \
            sorted((cp, c, f"registry.k8s.io/{c}:{K8S_NEW}") for cp in CPS for c in COMPONENTS)
        assert {n.status.node_info.kubelet_version for n in core.list_node(_request_timeout=10).items} == {K8S_NEW}
    finally:
        api.close()
    print(f"Kubernetes upgrade of {len(ORDER)} nodes: {elapsed:.1f} s")
    before = calls()
    stack.up("--expect-no-changes")
    assert all(v == 0 for v in since(before, calls(), "ApplyConfiguration").values())


def test_kubernetes_upgrade_killed_mid_rollout_converges_without_applying_a_component_twice(d2):
    stack, _ = d2
    if versions() != {a: "v1.13.3" for a in ORDER} or not k8s_on(K8S_NEW):
        pytest.skip("the earlier rollouts did not finish")
    configure(d2, zone(3, "v1.13.3", kubernetesVersion=K8S_KILLED))
    start = log_of()[-1]["seq"]
    before = calls()
    # after the first control plane's apiserver moved, long before the rollout ends
    up_killed_once(stack, "k8s-kill-events.jsonl", "the first control plane's apiserver never moved", lambda: any(
        e["seq"] > start and e["event"] == "static-pod" for e in log_of([CPS[0]])))
    killed_at = log_of()[-1]["seq"]
    before_kill = k8s_changes([e for e in log_of() if start < e["seq"] <= killed_at])
    assert [c for _, c, _ in before_kill][:1] == ["kube-apiserver"] and len(before_kill) < 3 * len(CPS) + len(ORDER)
    stack.up()
    events = [e for e in log_of() if e["seq"] > start]
    assert k8s_changes(events) == ([(cp, c, K8S_KILLED) for cp in CPS for c in COMPONENTS]
                                   + [(n, "kubelet", K8S_KILLED) for n in ORDER])
    applied = since(before, calls(), "ApplyConfiguration")
    # across both runs: one config per component, then the ConfigApply of the full config
    assert applied == {**{cp: 4 + 1 for cp in CPS}, **{w: 1 + 1 for w in WORKERS}}, applied
    assert k8s_on(K8S_KILLED)
    before = calls()
    stack.up("--expect-no-changes")
    after = calls()
    assert all(v == 0 for m in ("ApplyConfiguration", "ImagePull") for v in since(before, after, m).values())


def test_kubernetes_upgrade_with_a_removed_gate_in_a_patch_is_refused_before_any_node_changes(d2):
    """The zone's patch sets a feature gate Kubernetes 1.36 removes: the preview refuses the minor
    step, naming it, and so does an `up` (its diff runs first); no node is touched."""
    stack, _ = d2
    if versions() != {a: "v1.13.3" for a in ORDER} or not k8s_on(K8S_KILLED):
        pytest.skip("the earlier rollouts did not finish")
    patch = {"cluster": {"apiServer": {"extraArgs": {"feature-gates": f"{REMOVED_GATE}=true"}}}}
    configure(d2, zone(3, "v1.13.3", kubernetesVersion=K8S_NEXT_MINOR, patches=[*PATCHES, patch]))
    before = calls()
    try:
        for run in (("preview",), ("up", "--yes", "--skip-preview")):
            refused = stack.run(*run, check=False)
            text = output(refused)
            assert refused.returncode != 0, text[-3000:]
            assert ("zones[0].kubernetesVersion: the Kubernetes upgrade v1.35.6 → v1.36.0 was refused" in text
                    and f"kube-apiserver feature gate {REMOVED_GATE} is removed in v1.36.0" in text), text[-3000:]
    finally:
        configure(d2, zone(3, "v1.13.3", kubernetesVersion=K8S_KILLED))
    after = calls()
    assert all(v == 0 for m in ("ApplyConfiguration", "ImagePull", "Upgrade") for v in since(before, after, m).values())
    assert k8s_on(K8S_KILLED)


def k8s_on(version: str) -> bool:
    """Every control plane's static pods and every kubelet run `version` (the lab's kubelets say so)."""
    events = log_of()
    last: dict[tuple[str, str], str] = {}
    for node, component, v in k8s_changes(events):
        last[(node, component)] = v
    return all(last.get((cp, c)) == version for cp in CPS for c in COMPONENTS) and \
        all(last.get((n, "kubelet")) == version for n in ORDER)


# --- scaling down ----------------------------------------------------------------------------------


def test_scale_down_to_one_leaves_etcd_one_at_a_time_api_answering(d2):
    stack, _ = d2
    if not ready(stack, "d2") or etcd_members(stack) != sorted(CPS):
        pytest.skip("the zone is not at three control planes")
    configure(d2, zone(1, "v1.13.3", kubernetesVersion=K8S_KILLED if k8s_on(K8S_KILLED) else K8S_NEW))
    start = log_of()[-1]["seq"]
    before = calls()
    with ApiPoller(kubeconfig(stack)) as poll:
        stack.up()
    assert poll.failed == 0 and poll.ok > 10, poll.errors[:3]
    assert etcd_members(stack) == [CPS[0]] and ready(stack, "d2")
    assert [control.read_state(a)["mode"] for a in CPS[1:]] == ["maintenance", "maintenance"]
    resets = [e["node"] for e in log_of(CPS[1:]) if e["event"] == "reboot" and e["seq"] > start]
    assert resets == [CPS[2], CPS[1]], resets  # the last listed leaves first, one at a time
    after = calls()
    assert all(since(before, after, m)[w] == 0 for w in WORKERS for m in ("Reset", "Upgrade"))
