"""The lab, stacks and node observations the TalosCluster e2e modules share: one lab (nodes
127.0.33.11+, hub 127.0.0.33) for the package tests/e2e/ha_zone/, and one HA zone (3 control
planes, 2 workers) that its test_talos_cluster_engine brings up and test_zone_edits_engine then
edits. Other modules use the helpers below with labs of their own."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from kontinuum.naming import instance_name
from lab import upstream
from lab.pulumi_cli import ROOT, Stack
from lab.talos_node import control
from tests.e2e.labs import STANDIN_CERT_MANAGER_CHART, running_lab

FIRST_ADDRESS = "127.0.33.11"
HUB_ADDRESS = "127.0.0.33"
NODES = 9  # ha (5) + edit spares (2) + migration (2)
REGION = "e2e"
MUTATING = ("ApplyConfiguration", "Bootstrap", "Reset", "Upgrade", "Reboot")  # and every Etcd* call but READS
READS = ("EtcdMemberList",)

# Short bounds: a failure is quick and says which wait ran out.
TIMEOUTS = {"discovery": 5, "apply": 45, "bootstrap": 45, "kubeconfig": 60, "cilium": 90, "health": 90,
            "certManager": 90, "certificate": 60, "registryJoin": 60, "teardown": 30}


def address(i: int) -> str:
    a, b, c, d = FIRST_ADDRESS.split(".")
    return f"{a}.{b}.{c}.{int(d) + i}"


HA_CPS, HA_WORKERS = [address(0), address(1), address(2)], [address(3), address(4)]
HA_APPLY_BOUND = 20  # seconds: the first up's hung worker fails within it


# --- the lab and its nodes --------------------------------------------------------------------


@pytest.fixture(scope="package")
def cluster_lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("lab"), nodes=NODES, first_address=FIRST_ADDRESS,
                     hub_address=HUB_ADDRESS) as state:
        yield state


node_state = control.read_state
set_faults = control.set_faults


def lab_events(address: str, last: int = 20) -> str:
    """The lab's account of one machine (mode, etcd standing, its last events), for a failure
    message: a refused call then names the reboot or crash behind it."""
    try:
        s = node_state(address)
    except Exception as e:  # noqa: BLE001 - a diagnostic must not hide the failure it explains
        return f"(the lab's control port of {address} did not answer: {e!r})"
    lines = [f"lab view of {address}: mode={s['mode']} etcd={s['etcd']} boot={s['boot_id']}"]
    lines += [f"  {e}" for e in s["events"][-last:]]
    return "\n".join(lines)


def calls(addresses: list[str]) -> dict[str, dict[str, int]]:
    return {a: dict(node_state(a)["calls"]) for a in addresses}


def delta(before: dict, after: dict) -> dict[str, dict[str, int]]:
    return {a: {m: n - before[a].get(m, 0) for m, n in after[a].items() if n != before[a].get(m, 0)} for a in after}


def mutating(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out = {a: {m: n for m, n in c.items() if m in MUTATING or (m.startswith("Etcd") and m not in READS)}
           for a, c in counts.items()}
    return {a: c for a, c in out.items() if c}


def all_nodes() -> list[str]:
    return [address(i) for i in range(NODES)]


# --- stacks -----------------------------------------------------------------------------------


def zone(name: str, cps: list[str], workers: dict[str, list[str]] | None = None, *, endpoint: str | None = None,
         labels: dict[str, dict] | None = None, timeouts: dict | None = None) -> dict:
    machines = [{"address": a, "pool": "controlplane"} for a in cps]
    pools = []
    for pool, addrs in (workers or {}).items():
        machines += [{"address": a, "pool": pool} for a in addrs]
        pools.append({"name": pool, "replicas": len(addrs), "nodeLabels": (labels or {}).get(pool, {})})
    z = {"zone": name, "talosAddresses": machines, "controlPlane": {"replicas": len(cps)}, "workers": pools}
    if endpoint:
        z["controlPlane"]["endpoint"] = endpoint
    if timeouts:
        z["timeouts"] = timeouts
    return z


def write_config(stack: Stack, lab_state: Path, z: dict) -> None:
    stack.write_config_file(stack_config(lab_state, z))


def stack_config(lab_state: Path, z: dict, region: str = REGION) -> dict:
    """A lab stack file's content: one zone of `region` on the lab at lab_state."""
    return {"config": {
        "kontinuum:region": region,
        "kontinuum:hubKubeconfigFile": str(lab_state / "hub" / "kubeconfig"),
        "kontinuum:hub": {"dnsDomain": "kontinuum.test", "grpcEndpoint": "hub.kontinuum.test:443",
                          "acme": {"email": "ops@kontinuum.test", "server": "https://acme.kontinuum.test/directory"},
                          "auth": {"mode": "anonymous"}},
        "kontinuum:defaults": {
            "serverImage": "ghcr.io/kontinuum-sh/kontinuum-server:lab",
            "addons": {"cilium": {"chart": {"path": str(upstream.prepare("cilium"))}},
                       "certManager": {"chart": {"path": str(STANDIN_CERT_MANAGER_CHART)}},
                       "gatewayApi": {"source": str(upstream.prepare("gateway-api"))}},
            "timeouts": TIMEOUTS,
        },
        "kontinuum:zones": [z],
    }}


def new_stack(tmp: Path, lab_state: Path, z: dict) -> Stack:
    stack = Stack(ROOT, z["zone"], tmp / f"{z['zone']}-state", passphrase="e2e",
                  config_file=tmp / f"Pulumi.{z['zone']}.yaml",
                  extra_env={"PULUMI_DEBUG_COMMANDS": "true"}).init()  # the engine's --event-log needs it
    write_config(stack, lab_state, z)
    return stack


def ready(stack: Stack, name: str) -> bool:
    return stack.outputs()["zones"][name]["ready"] is True


def events(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line the engine is still writing
    return out


def member(zone_name: str, address: str) -> str:
    """URN suffix of a machine's ConfigApply: a TalosCluster child named after its Instance (the
    Instance itself, a child of the Zone, has the same name)."""
    return f"TalosCluster$pulumi-python:dynamic/talos:ConfigApply::{instance_name(REGION, zone_name, address)}"


def seq(evs: list[dict], kind: str, urn_suffix: str) -> int:
    """Sequence number of the first `kind` event (resourcePreEvent: started, resOutputsEvent:
    finished) of the resource whose URN ends with ::<urn_suffix> (or with urn_suffix when it
    holds a type, see member())."""
    end = urn_suffix if "::" in urn_suffix else f"::{urn_suffix}"
    for e in evs:
        meta = (e.get(kind) or {}).get("metadata") or {}
        if meta.get("urn", "").endswith(end):
            return e["sequence"]
    raise AssertionError(f"no {kind} for {urn_suffix} in the event log")


def output(result: subprocess.CompletedProcess) -> str:
    return (result.stdout or "") + (result.stderr or "")


def up_in_background(stack: Stack, event_log: Path) -> subprocess.Popen:
    return subprocess.Popen(stack.command("up", "--yes", "--skip-preview", f"--event-log={event_log}"),
                            cwd=stack.project_dir, env=stack.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_event(proc: subprocess.Popen, log: Path, kind: str, urn_suffix: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if log.exists():
            try:
                seq(events(log), kind, urn_suffix)
                return
            except AssertionError:
                pass
        assert proc.poll() is None, f"`pulumi up` ended before {kind} of {urn_suffix}:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, f"no {kind} of {urn_suffix} within {timeout:g} s"
        time.sleep(0.2)


@pytest.fixture(scope="package")
def ha(cluster_lab, tmp_path_factory):
    """The HA zone's stack (brought up by test_talos_cluster_engine, edited by the edit matrix)."""
    tmp = tmp_path_factory.mktemp("ha")
    z = zone("ha", HA_CPS, {"web": HA_WORKERS}, endpoint=f"https://{HA_CPS[0]}:6443",
             timeouts={**TIMEOUTS, "apply": HA_APPLY_BOUND})
    return new_stack(tmp, cluster_lab, z), z, tmp
