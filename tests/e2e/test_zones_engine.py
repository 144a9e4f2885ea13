"""Zones under the real engine on the embedded lab (issue 8): the repo's main program, with
per-test stack configs derived from stacks/Pulumi.lab.yaml kept in tmp (Stack.config_file), and
one lab for the module. Tests run in file order and share the lab; the last one stops it.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client

from kontinuum import zone_identity
from kontinuum.hub import crds as hub_crds
from kontinuum.hub.inventory import Inventory
from kontinuum.hub.registry import Registry, parse_heartbeat
from kontinuum.kube.clients import api_client
from lab.pulumi_cli import ROOT, Stack
from lab.talos_node import control
from tests.e2e.labs import lab_cli, lab_stack_config, running_lab

FIRST = "127.0.34.11"
HUB_ADDRESS = "127.0.0.34"
NODES = 4  # a, b: the two-zone stack (a dies last); c: the wrong identity; d: a dead control plane
ADDRESSES = [f"127.0.34.{11 + i}" for i in range(NODES)]
REGION = "lab"
BOOTSTRAP_TOKEN = re.compile(r"(?<![a-z0-9])[a-z0-9]{6}\.[a-z0-9]{16}(?![a-z0-9])")


# -- lab ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("zones-lab"), nodes=NODES, first_address=FIRST,
                     hub_address=HUB_ADDRESS) as state:
        yield state


def hub_kubeconfig(lab: Path) -> Path:
    return lab / "hub" / "kubeconfig"


node_state = control.read_state
reset_calls = control.reset_calls


def lab_status(lab: Path) -> dict:
    return json.loads((lab / "status.json").read_text())


# -- stacks -------------------------------------------------------------------------------------


def lab_config(lab: Path, zones: list[dict], **timeouts) -> dict:
    """stacks/Pulumi.lab.yaml with this lab's hub kubeconfig, the given zones and timeouts."""
    cfg = lab_stack_config(lab)
    cfg["kontinuum:defaults"]["timeouts"].update(timeouts)
    cfg["kontinuum:zones"] = zones
    return cfg


def write_config(stack: Stack, config: dict) -> None:
    stack.write_config_file({"config": config})


def new_stack(tmp: Path, name: str, config: dict) -> Stack:
    stack = Stack(ROOT, name, tmp / f"{name}-state", passphrase="e2e-zones",
                  config_file=tmp / f"Pulumi.{name}.yaml").init()
    write_config(stack, config)
    return stack


def output_text(result: subprocess.CompletedProcess) -> str:
    return (result.stdout or "") + (result.stderr or "")


# -- hub ----------------------------------------------------------------------------------------


def inventory(lab: Path) -> Inventory:
    return Inventory.from_kubeconfig(hub_kubeconfig(lab).read_text())


def instances(lab: Path, zone: str) -> dict[str, str | None]:
    """Instance name -> the pool holding it (None: unclaimed)."""
    return {o["metadata"]["name"]: (o["metadata"].get("labels") or {}).get(hub_crds.LABEL_CLAIMED_BY)
            for o in inventory(lab).list({hub_crds.LABEL_REGION: REGION, hub_crds.LABEL_ZONE: zone})}


def heartbeats(lab: Path) -> dict[str, object]:
    registry = Registry.from_kubeconfig(hub_kubeconfig(lab).read_text())
    try:
        return {o["metadata"]["name"]: parse_heartbeat((o.get("status") or {}).get("heartbeat"))
                for o in registry.list()}
    finally:
        registry.close()


def hub_core(lab: Path) -> client.CoreV1Api:
    return client.CoreV1Api(api_client(hub_kubeconfig(lab).read_text()))


def hub_identity_secret(lab: Path, zone: str):
    try:
        return hub_core(lab).read_namespaced_secret(hub_crds.hub_identity_secret_name(REGION, zone),
                                                     hub_crds.HUB_NAMESPACE, _request_timeout=15)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


# -- state --------------------------------------------------------------------------------------


def resource_name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def zone_resources(export: dict, zone: str) -> dict[str, dict]:
    """The state's resources of zone <region>-<zone>, by URN."""
    prefix = f"{REGION}-{zone}"
    return {r["urn"]: r for r in export["deployment"].get("resources") or []
            if resource_name(r["urn"]).startswith(prefix)}


# -- the two-zone stack -------------------------------------------------------------------------

ZONE_A = {"zone": "a", "talosAddresses": [ADDRESSES[0]]}  # unregisterInstancesOnDelete: false (default)
ZONE_B = {"zone": "b", "talosAddresses": [ADDRESSES[1]], "unregisterInstancesOnDelete": True}


@pytest.fixture(scope="module")
def two_zones(lab, tmp_path_factory) -> Stack:
    stack = new_stack(tmp_path_factory.mktemp("zones"), "lab", lab_config(lab, [ZONE_A, ZONE_B]))
    return stack


def test_two_zones_come_up_ready_with_heartbeats_in_the_hub(lab, two_zones):
    t0 = time.monotonic()
    two_zones.up(timeout=600)
    print(f"two zones up in {time.monotonic() - t0:.0f} s")
    zones = two_zones.outputs()["zones"]
    assert {z: zones[z]["ready"] for z in zones} == {"a": True, "b": True}
    assert zones["a"]["url"] == "https://a.lab.kontinuum.test"
    assert all(re.fullmatch(r"[0-9a-f]{64}", zones[z]["identityThumbprint"]) for z in zones)
    beats = heartbeats(lab)
    assert beats.get("lab-a") is not None and beats.get("lab-b") is not None, beats
    assert {node_state(a)["mode"] for a in ADDRESSES[:2]} == {"configured"}
    assert set(instances(lab, "a").values()) == {"lab-a-controlplane"}


def test_exported_state_holds_no_secret_in_plain_text(two_zones):
    text = json.dumps(two_zones.export())
    # Drop the ciphertexts: what is left is what anyone reading the state file sees.
    plain = re.sub(r'"ciphertext":\s*"[^"]*"', '"ciphertext": ""', text)
    # The zone identity's certificate is public (the hub holds it too); no other PEM may show.
    assert set(re.findall(r"-----BEGIN ([A-Z ]+)-----", plain)) <= {"CERTIFICATE"}
    for needle in ("PRIVATE KEY", "client-key-data", "client-certificate-data"):
        assert needle not in plain, needle
    assert not BOOTSTRAP_TOKEN.search(plain), BOOTSTRAP_TOKEN.search(plain).group(0)
    # ... and the secrets are in the state, encrypted: the check above is not vacuous.
    revealed = two_zones.run("stack", "export", "--stack", two_zones.name, "--show-secrets").stdout
    assert "PRIVATE KEY" in revealed and "client-key-data" in revealed and BOOTSTRAP_TOKEN.search(revealed)


def test_removing_a_zone_deletes_only_it_and_returns_its_nodes(lab, two_zones):
    write_config(two_zones, lab_config(lab, [ZONE_A]))
    before = zone_resources(two_zones.export(), "a")
    reset_calls(ADDRESSES[0])
    plan = json.loads(two_zones.preview("--json").stdout)
    # Besides the region guard recording which zones the region has, only zone b's objects go.
    steps = [s for s in plan["steps"] if s["op"] != "same" and resource_name(s["urn"]) != "lab-region"]
    assert steps and {s["op"] for s in steps} == {"delete"}, [(s["op"], s["urn"]) for s in steps]
    assert all(resource_name(s["urn"]).startswith("lab-b") for s in steps), [s["urn"] for s in steps]
    assert all(s["op"] == "same" for s in plan["steps"] if resource_name(s["urn"]).startswith("lab-a"))

    two_zones.up(timeout=600)
    assert node_state(ADDRESSES[1])["mode"] == "maintenance"
    assert instances(lab, "b") == {}  # released, then unregistered: zone b asked for it
    assert hub_identity_secret(lab, "b") is None
    # Zone a: untouched in the state, never called, still ready and heartbeating.
    after = zone_resources(two_zones.export(), "a")
    assert after.keys() == before.keys()
    assert [u for u in after if after[u].get("modified") != before[u].get("modified")] == []
    assert sum(node_state(ADDRESSES[0])["calls"].values()) == 0
    assert two_zones.outputs()["zones"] == {"a": {**two_zones.outputs()["zones"]["a"], "ready": True}}
    assert node_state(ADDRESSES[0])["mode"] == "configured"
    beat = heartbeats(lab)["lab-a"]
    assert beat is not None and time.time() - beat.timestamp() < 60


# -- a wrong identity key -------------------------------------------------------------------------

JOIN_TIMEOUT = 20


def zone_kubeconfig(lab: Path, zone: str, timeout: float = 300) -> str:
    """The lab's admin kubeconfig of cluster <region>-<zone>, once its control plane runs."""
    deadline = time.monotonic() + timeout
    while True:
        for c in lab_status(lab).get("clusters", []):
            if c["name"] == f"{REGION}-{zone}" and c["state"] == "running":
                return Path(c["kubeconfig"]).read_text()
        assert time.monotonic() < deadline, f"cluster {REGION}-{zone} never ran"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def wrong_identity(lab, tmp_path_factory) -> Stack:
    zone = {"zone": "c", "talosAddresses": [ADDRESSES[2]]}
    return new_stack(tmp_path_factory.mktemp("ident"), "ident", lab_config(lab, [zone], registryJoin=JOIN_TIMEOUT))


def test_wrong_identity_key_fails_the_join_within_its_bound_saying_why(lab, wrong_identity):
    """The zone's identity Secret is overwritten with another key the moment the footprint
    delivers it, before the server starts: the hub holds the certificate of the key Pulumi
    issued, the zone presents another one."""
    stack = wrong_identity
    proc = subprocess.Popen(stack.command("up", "--yes", "--skip-preview"), cwd=stack.project_dir, env=stack.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        core = client.CoreV1Api(api_client(zone_kubeconfig(lab, "c")))
        other = zone_identity.issue(REGION, "c")
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the footprint never delivered the identity"
            try:
                core.read_namespaced_secret(hub_crds.ZONE_IDENTITY_SECRET, hub_crds.ZONE_NAMESPACE,
                                            _request_timeout=5)
                break
            except Exception:  # noqa: BLE001 - not there yet, or the apiserver is still starting
                time.sleep(0.1)
        core.patch_namespaced_secret(hub_crds.ZONE_IDENTITY_SECRET, hub_crds.ZONE_NAMESPACE, {"data": {
            "tls.crt": base64.b64encode(other.certificate_pem.encode()).decode(),
            "tls.key": base64.b64encode(other.private_key_pem.encode()).decode()}}, _request_timeout=15)
        tampered = time.monotonic()
        out, _ = proc.communicate(timeout=JOIN_TIMEOUT + 240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode != 0, out[-3000:]
    # Bounded: what remains after the tamper is the Deployment, the Certificate and the join's 20 s.
    assert time.monotonic() - tampered < JOIN_TIMEOUT + 150
    assert f"zone {REGION}-c never joined the hub registry within {JOIN_TIMEOUT} s" in out, out[-3000:]
    assert (f"identity key in {hub_crds.ZONE_NAMESPACE}/{hub_crds.ZONE_IDENTITY_SECRET} does not match the hub's "
            "certificate") in out
    assert f"check that the identity key in {hub_crds.ZONE_NAMESPACE}/{hub_crds.ZONE_IDENTITY_SECRET}" in out
    assert "lab-c" not in {k for k, v in heartbeats(lab).items() if v is not None}


# -- a dead zone cluster: the teardown escape hatch ------------------------------------------------


def kill_control_plane(lab: Path, zone: str) -> list[str]:
    """SIGKILL the processes the lab runs for cluster <region>-<zone> (by pid, from its status)."""
    import os
    import signal

    killed = []
    for name, pid in lab_status(lab)["pids"].items():
        if name.startswith(f"{REGION}-{zone}/"):
            os.kill(pid, signal.SIGKILL)
            killed.append(name)
    return killed


def deployed_then_killed(lab: Path, tmp: Path, zone: str, address: str) -> Stack:
    """A one-zone stack brought up, then its cluster's control plane SIGKILLed."""
    stack = new_stack(tmp, f"dead{zone}", lab_config(lab, [{"zone": zone, "talosAddresses": [address]}], teardown=30))
    stack.up(timeout=600)
    killed = kill_control_plane(lab, zone)
    assert any(k.endswith("/kube-apiserver") for k in killed), killed
    return stack


def with_hatch(lab: Path, zone: str, address: str) -> dict:
    return lab_config(lab, [{"zone": zone, "talosAddresses": [address], "teardown": {"skipUnreachableCluster": True}}],
                      teardown=30)


def assert_torn_down(lab: Path, stack: Stack, zone: str, address: str) -> None:
    assert node_state(address)["mode"] == "maintenance"
    assert list(instances(lab, zone).values()) == [None]
    assert hub_identity_secret(lab, zone) is None  # the hub is alive: its side is cleaned up
    assert stack.export()["deployment"].get("resources") in (None, [])


@pytest.fixture(scope="module")
def dead_zone(lab, tmp_path_factory) -> Stack:
    return deployed_then_killed(lab, tmp_path_factory.mktemp("dead"), "d", ADDRESSES[3])


def test_destroy_of_a_dead_zone_cluster_fails_bounded_and_clear(lab, dead_zone):
    before = zone_resources(dead_zone.export(), "d").keys()
    t0 = time.monotonic()
    result = dead_zone.run("destroy", "--yes", "--skip-preview", check=False, timeout=600)
    out = output_text(result)
    assert result.returncode != 0 and time.monotonic() - t0 < 180
    # The guard goes first, once, bounded by the zone's teardown timeout, and says the way out.
    assert re.search(r"zone lab-d: its cluster's API server https://[0-9.]+:\d+ did not answer within 30 s "
                     r"\(.*(Connection refused|timed out).*\)", out), out[-3000:]
    assert "set `teardown: {skipUnreachableCluster: true}` on zone d" in out
    # Nothing past the dead cluster was torn down: the node keeps its config and its claim.
    assert node_state(ADDRESSES[3])["mode"] == "configured"
    assert set(instances(lab, "d").values()) == {"lab-d-controlplane"}
    assert zone_resources(dead_zone.export(), "d").keys() == before  # the guard went first, alone


def test_escape_hatch_lets_destroy_finish_resetting_nodes_and_releasing_claims(lab, dead_zone):
    """The documented way out: set the hatch, `pulumi up` (records it, calls nothing on the
    dead cluster), then a plain `pulumi destroy` finishes."""
    write_config(dead_zone, with_hatch(lab, "d", ADDRESSES[3]))
    reset_calls(ADDRESSES[3])
    t0 = time.monotonic()
    up = dead_zone.run("up", "--yes", "--skip-preview", check=False, timeout=600)
    assert up.returncode == 0, output_text(up)[-12000:]
    assert time.monotonic() - t0 < 120
    assert sum(node_state(ADDRESSES[3])["calls"].values()) == 0  # settings only: no Talos call either
    t0 = time.monotonic()
    result = dead_zone.run("destroy", "--yes", "--skip-preview", check=False, timeout=600)
    assert result.returncode == 0, output_text(result)[-3000:]
    assert time.monotonic() - t0 < 180
    assert_torn_down(lab, dead_zone, "d", ADDRESSES[3])


def test_destroy_run_program_of_a_dead_zone_with_the_hatch_returns_its_node_and_keeps_its_instance(lab, two_zones):
    """Zone a of the two-zone stack (unregisterInstancesOnDelete: false), its cluster's control plane
    SIGKILLed: when the nodes still answer, `pulumi destroy --run-program` takes the hatch from the
    program (retain-on-delete) without a `pulumi up` first. Its node is reset, its Instance kept and
    released, its hub identity gone, and the stack empty; zone b's Instance went with zone b."""
    killed = kill_control_plane(lab, "a")
    assert any(k.endswith("/kube-apiserver") for k in killed), killed
    write_config(two_zones, with_hatch(lab, "a", ADDRESSES[0]))
    t0 = time.monotonic()
    result = two_zones.run("destroy", "--yes", "--skip-preview", "--run-program", check=False, timeout=600)
    assert result.returncode == 0, output_text(result)[-12000:]
    assert time.monotonic() - t0 < 180
    assert_torn_down(lab, two_zones, "a", ADDRESSES[0])
    assert instances(lab, "b") == {}


# -- the lab down ---------------------------------------------------------------------------------


def secret_values(stack: Stack) -> list[str]:
    """Every secret string of the stack's state, decrypted (long enough to be a real value)."""
    export = json.loads(stack.run("stack", "export", "--stack", stack.name, "--show-secrets").stdout)
    found: list[str] = []

    def walk(v, secret: bool) -> None:
        if isinstance(v, dict):
            if "plaintext" in v and len(v) == 2:
                try:
                    walk(json.loads(v["plaintext"]), True)
                except ValueError:
                    walk(v["plaintext"], True)
                return
            for x in v.values():
                walk(x, secret)
        elif isinstance(v, list):
            for x in v:
                walk(x, secret)
        elif isinstance(v, str) and secret and len(v) >= 16:
            found.append(v)

    walk(export, False)
    return found


def test_preview_with_the_lab_down_contacts_nothing_and_prints_no_secret(lab, tmp_path):
    down = lab_cli(lab, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert hub_kubeconfig(lab).exists()  # kept: the lab stack still previews
    for address in ADDRESSES:
        with pytest.raises(OSError):
            node_state(address)

    fresh = new_stack(tmp_path, "lab", lab_config(lab, [ZONE_A, {**ZONE_B, "unregisterInstancesOnDelete": False}]))
    t0 = time.monotonic()
    out = output_text(fresh.preview(timeout=300))
    assert time.monotonic() - t0 < 120
    for name in ("lab-a-controlplane", "lab-b-controlplane", "lab-a-join", "lab-b-hub-identity"):
        assert name in out, name
    assert "create" in out and "BEGIN" not in out and not BOOTSTRAP_TOKEN.search(out)
    for contact in ("unreachable", "connection refused", "no address answered", "timed out"):
        assert contact not in out, contact


def test_preview_of_a_deployed_zone_with_the_lab_down_succeeds_and_prints_no_secret(lab, wrong_identity):
    secrets = secret_values(wrong_identity)  # a deployed zone: its talosconfig, kubeconfig and key
    assert any("PRIVATE KEY" in s for s in secrets) and any(BOOTSTRAP_TOKEN.search(s) for s in secrets)
    assert lab_cli(lab, "down").returncode == 0  # stopped already by the test above
    t0 = time.monotonic()
    result = wrong_identity.run("preview", check=False, timeout=300)
    out = output_text(result)
    assert time.monotonic() - t0 < 120
    assert [s for s in secrets if s in out] == [] and "PRIVATE KEY" not in out and not BOOTSTRAP_TOKEN.search(out)
    assert result.returncode == 0, out[-3000:]
    assert "lab-c-join" in out
