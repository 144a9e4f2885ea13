"""Kill chains (issue 15) shared by the kill modules: a `pulumi up`/`destroy` killed inside each
new kind of step (tests/e2e/kills.py kills one run), re-run plainly until a run finishes, and the
checks after it (converged, nothing left running, claims returned).

Each kill leaves the run's lock behind, and the next plain run (tools/pulumi runs `kontinuum
recover` first) clears it: a chain gets past its first kill only that way. The kills are split over
two modules with a lab and one zone each (creates and a Helm upgrade; destroy), so the suite runs
the two chains side by side.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kubernetes import client

from kontinuum.hub import crds as hub_crds
from kontinuum.hub.inventory import Inventory
from kontinuum.kube.clients import api_client
from lab.pulumi_cli import ROOT, Stack
from tests.e2e import kills
from tests.e2e.labs import lab_stack_config

REGION = "lab"
MAX_RUNS = 40  # a chain that has not finished by then is not converging


def zones(addresses: list[str]) -> tuple[dict, dict]:
    """Zone a on the first address, and the same with new Cilium values (a Helm upgrade)."""
    a = {"zone": "a", "talosAddresses": [addresses[0]]}
    return a, {**a, "addons": {"cilium": {"values": {"e2eKills": "upgraded"}}}}


def lab_config(lab: Path, zones: list[dict]) -> dict:
    cfg = lab_stack_config(lab)
    cfg["kontinuum:zones"] = zones
    return cfg


def new_stack(lab: Path, tmp: Path, passphrase: str, zones: list[dict]) -> Stack:
    s = Stack(ROOT, REGION, tmp / "state", passphrase=passphrase, config_file=tmp / "Pulumi.lab.yaml",
              extra_env={"PULUMI_DEBUG_COMMANDS": "true"}).init()  # --event-log needs it
    s.write_config_file({"config": lab_config(lab, zones)})
    s.logs = tmp  # noqa: attribute for the chains' event logs
    return s


def zone_kubeconfig(lab: Path, zone: str) -> str | None:
    status = json.loads((lab / "status.json").read_text())
    for c in status.get("clusters", []):
        if c["name"] == f"{REGION}-{zone}" and c["state"] == "running":
            return Path(c["kubeconfig"]).read_text()
    return None


def helm_record_watcher(lab: Path):
    """Waits, while the run goes on, for the pending release record an install or upgrade writes
    before any object, then freezes the run: the kill then lands inside `helm install`/`upgrade`.
    Returns the latest record's status at the kill."""
    def watch(entry: dict, refreeze) -> str | None:
        inputs = entry["resource"].get("inputs") or {}
        zone = entry["resource"]["urn"].rsplit("::", 1)[-1].split("-")[1]
        kubeconfig = zone_kubeconfig(lab, zone)
        if kubeconfig is None:
            return None
        core = client.CoreV1Api(api_client(kubeconfig))
        selector = f"owner=helm,name={inputs.get('name')}"
        namespace = inputs.get("namespace") or "default"

        def records() -> list:
            try:
                return core.list_namespaced_secret(namespace, label_selector=selector, _request_timeout=5).items
            except Exception:  # noqa: BLE001 - the apiserver may be busy; the deadline bounds it
                return []

        def version(record) -> int:
            return int(record.metadata.labels.get("version", "0"))

        before = max(map(version, records()), default=0)
        deadline = time.monotonic() + 240  # the upstream Cilium chart renders slowly on a busy machine
        while time.monotonic() < deadline:
            items = records()
            pending = any(i.metadata.labels.get("status", "").startswith("pending-") for i in items)
            if pending or max(map(version, items), default=0) > before:  # pending, or already past it
                refreeze()
                latest = max(records() or items, key=version, default=None)
                return latest.metadata.labels.get("status") if latest else None
            time.sleep(0.01)
        return None
    return watch


def chain(stack: Stack, command: str, op: str, *, helm_record=None, skip: set[str] = frozenset()
          ) -> tuple[list[kills.Kill], float]:
    """Kill `command` in each new kind of `op` step (but those in `skip`) until a plain run
    finishes; returns the kills and the wall time of the whole chain."""
    seen: set[str] = set(skip)
    done: list[kills.Kill] = []
    t0 = time.monotonic()
    for i in range(MAX_RUNS):
        result = kills.run_killed(stack, command, stack.logs / f"{command}-{op}-{i}.jsonl", op, seen,
                                  helm_record=helm_record)
        if isinstance(result, kills.Kill):
            assert locks(stack), f"the run killed in {result.kind} left no lock behind"
            seen.add(result.kind)
            done.append(result)
            print(f"killed {command} in {op} of {result.kind} ({result.urn.rsplit('::', 1)[-1]}); "
                  f"{result.leftover_at_kill} processes left at the kill, none after {result.leftover_after:.1f} s"
                  + (f"; Helm record {result.helm_status}" if result.helm_status else ""))
            continue
        assert result.returncode == 0, f"the plain re-run after {len(done)} kills failed:\n" \
                                       f"{result.stdout_text[-6000:]}"
        assert not locks(stack), "the finished run left a lock behind"
        return done, time.monotonic() - t0
    raise AssertionError(f"`pulumi {command}` did not finish after {MAX_RUNS} runs: {[k.kind for k in done]}")


def locks(stack: Stack) -> list[Path]:
    """The file backend's locks of the stack (backend/.pulumi/locks/<org>/<project>/<stack>/<id>.json)."""
    return list((stack.state_dir / "backend" / ".pulumi" / "locks").rglob("*.json"))


def assert_converged(stack: Stack) -> None:
    assert kills.pending(stack) == [], kills.pending(stack)
    preview = stack.run("preview", "--expect-no-changes", check=False, timeout=300)
    assert preview.returncode == 0, (preview.stdout + preview.stderr)[-4000:]


def assert_no_slow_leftovers(done: list[kills.Kill]) -> None:
    slow = [(k.kind, round(k.leftover_after, 1)) for k in done if k.leftover_after > kills.LEFTOVER_BOUND]
    assert slow == [], f"processes outlived a killed run by more than {kills.LEFTOVER_BOUND} s: {slow}"


def claims(lab: Path, zone: str) -> dict[str, str | None]:
    inv = Inventory.from_kubeconfig((lab / "hub" / "kubeconfig").read_text())
    return {o["metadata"]["name"]: (o["metadata"].get("labels") or {}).get(hub_crds.LABEL_CLAIMED_BY)
            for o in inv.list({hub_crds.LABEL_REGION: REGION, hub_crds.LABEL_ZONE: zone})}
