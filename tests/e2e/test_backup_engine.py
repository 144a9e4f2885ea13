"""Day 2 on a zone the real engine brought up (issues 18 and 30), one lab and one stack:
- the zone's backup credential (os:etcd:backup) takes an etcd snapshot with the real talosctl
  and is refused everything else;
- etcd backup and restore through the operator CLI: `python -m kontinuum backup --verify` reads
  the zone from the stack's state, ships the sealed snapshot to an S3 bucket (SeaweedFS) and
  proves it restores in a scratch etcd, `status` reports it verified, `restore` refuses a healthy
  etcd, `--force` brings the snapshot back from the bucket, the next `pulumi up` changes nothing
  but what `backup.onUp` asks for: one backup per up, into the bucket;
- then both CAs rotated by changing `certificates.rotate`: the preview lists the phases, the up
  is killed mid-rotation and resumed, the Kubernetes API answers throughout, old credentials are
  refused and the stack's new ones work, and a second up changes nothing.
Its own lab: node 127.0.42.11, hub 127.0.0.42; the bucket on 127.0.66.42."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes import client, config as kconfig

from kontinuum.backup import files, store
from kontinuum.talos import secrets
from kontinuum.talos import talosconfig as tc
from kontinuum.talos.pki import CertKey
from kontinuum.talos.client import TalosClient
from kontinuum.talos.errors import TalosError
from lab.process import wait_until
from lab.pulumi_cli import ROOT
from lab.s3 import running_s3
from tests.e2e import kills
from tests.e2e.cluster_lab import TIMEOUTS, events, new_stack, output, ready, write_config, zone
from tests.e2e.labs import running_lab

NODE = "127.0.42.11"
S3_ADDRESS = "127.0.66.42"  # the backup bucket's SeaweedFS
T = 10


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("backup-lab"), nodes=1, first_address=NODE,
                     hub_address="127.0.0.42") as state:
        yield state


@pytest.fixture(scope="module")
def s3(tools_bin, tmp_path_factory):
    with running_s3(tmp_path_factory.mktemp("backup-s3"), address=S3_ADDRESS, bucket="kontinuum-backups") as server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())  # this process lists the bucket too
        yield server
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def cli(stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kontinuum", *args, "--stack", stack.name, "--zone", "dr"],
                          cwd=ROOT, env=stack.env(), capture_output=True, text=True, timeout=300)


def configmaps(core: client.CoreV1Api) -> set[str]:
    return {c.metadata.name for c in core.list_namespaced_config_map("default", _request_timeout=T).items
            if c.metadata.name.startswith("dr-")}


def test_backup_restore_and_backup_on_up(lab, s3, tmp_path):
    destination = f"s3://{s3.bucket}/fleet?endpoint={s3.endpoint}&s3ForcePathStyle=true&region=us-east-1"
    # The CA rotation below restarts the real apiserver on each new chain; on a loaded machine (a cold
    # `make test` builds beside it) that took over the lab's usual 45 s apply bound once.
    z = {**zone("dr", [NODE], timeouts={**TIMEOUTS, "apply": 120}), "backup": {"destination": destination, "keep": 2}}
    stack = new_stack(tmp_path, lab, z)
    stack.extra_env.update(s3.env())  # the standard AWS variables, for the CLI and the on-up backup
    stack.up()
    assert ready(stack, "dr")
    bucket = store.for_zone(destination, stack.name, "e2e-dr")
    assert bucket.names() == []  # no onUp: no backup yet
    backup_credential_takes_snapshots_only(stack, tmp_path)

    kubeconfig = stack.outputs(show_secrets=True)["kubeconfigs"]["dr"]
    api = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", {"metadata": {"name": "dr-a"}}, _request_timeout=T)
    taken = cli(stack, "backup", "--verify")  # shipped to the bucket, then restored into a scratch etcd
    assert taken.returncode == 0, output(taken)
    url = taken.stdout.strip()
    name = url.split("?")[0].rsplit("/", 1)[-1]
    assert url.startswith(f"s3://{s3.bucket}/fleet/{stack.name}/e2e-dr/") and "&region=us-east-1" in url, url
    assert bucket.names() == [name, files.verified_name(name)]
    assert "read back" in taken.stderr and "/registry/namespaces/kube-system" in taken.stderr, output(taken)
    assert "BEGIN" not in output(taken) and s3.secret_key not in output(taken)  # no key, certificate or secret
    assert status_of(stack, tmp_path)["verified_path"] == url
    core.create_namespaced_config_map("default", {"metadata": {"name": "dr-b"}}, _request_timeout=T)

    refused = cli(stack, "restore", "--snapshot", url)
    assert refused.returncode == 1 and "etcd is healthy on 127.0.42.11" in refused.stderr, output(refused)
    restored = cli(stack, "restore", "--snapshot", url, "--force")  # straight from the bucket
    assert restored.returncode == 0, output(restored)
    assert "1. wipe etcd data" in restored.stderr and "done; etcd is back" in restored.stderr
    api.close()
    api = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))  # the same credentials still work
    # The restore ends once etcd is back; the apiserver on the rebooted control plane follows its kubelet.
    wait_until("the API back with the restored objects", lambda: configmaps(client.CoreV1Api(api)) == {"dr-a"}, 120)
    api.close()

    # The restore changed nothing the stack holds: switching onUp on, the next up updates the
    # backup resource (which takes a backup, into the bucket) and nothing else.
    write_config(stack, lab, {**z, "backup": {**z["backup"], "onUp": True}})
    log = tmp_path / "events.jsonl"
    stack.up(f"--event-log={log}")
    changed = {meta["urn"].rsplit("::", 1)[-1]: meta["op"] for e in events(log)
               if (meta := (e.get("resOutputsEvent") or {}).get("metadata") or {}) and meta.get("op") != "same"
               and "::pulumi:providers:" not in meta["urn"]}  # the engine's provider bookkeeping
    assert changed == {"e2e-dr-etcd-backup": "update"}, changed
    kept = files.finished(bucket.names(), "e2e-dr")
    assert len(kept) == 2 and kept[0] == name, kept  # the CLI's and the up's
    assert ready(stack, "dr")
    backup_from_a_kit_without_the_state(stack, tmp_path, bucket)
    rotate_both_cas(stack, lab, z, tmp_path)  # the same zone, to keep the suite short


def backup_from_a_kit_without_the_state(stack, tmp_path, bucket) -> None:
    """The nightly job's way: an operator writes the kit once; the job takes and verifies a backup
    with it alone (no state, no passphrase, no admin credential)."""
    kit = tmp_path / "backup.kit"
    made = subprocess.run([sys.executable, "-m", "kontinuum", "backup-kit", "--stack", stack.name, "--out", str(kit)],
                          cwd=ROOT, env=stack.env(), capture_output=True, text=True, timeout=120)
    assert made.returncode == 0 and "e2e-dr: os:etcd:backup credential (expires" in made.stderr, output(made)
    assert kit.stat().st_mode & 0o777 == 0o600 and "BEGIN" not in output(made)
    [entry] = yaml.safe_load(kit.read_text())["zones"].values()
    held = x509.load_pem_x509_certificate(tc.parse(entry["talosconfig"]).crt)
    assert [a.value for a in held.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["os:etcd:backup"]
    assert set(entry) == {"cluster", "controlPlanes", "talosPort", "destination", "keep", "identity", "key", "talosconfig"}
    env = {k: v for k, v in stack.env().items() if k not in ("PULUMI_CONFIG_PASSPHRASE", "KONTINUUM_STATE")}
    env["PULUMI_BACKEND_URL"] = f"file://{tmp_path / 'no-state-here'}"
    before = len(files.finished(bucket.names(), "e2e-dr"))
    done = subprocess.run([sys.executable, "-m", "kontinuum", "backup", "--kit", str(kit), "--verify"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, output(done)
    assert "backup: verified s3://" in done.stderr and done.stdout.strip().startswith("s3://"), output(done)
    assert len(files.finished(bucket.names(), "e2e-dr")) == min(before + 1, 2)  # keep: 2


def status_of(stack, tmp_path) -> dict:
    """`status --json`'s observation of the healthy zone with a fresh verified backup: exit 0; with a
    renewal window longer than the credentials' lives, exit 1 naming them."""
    out = tmp_path / "status.json"
    run = lambda *extra: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "kontinuum", "status", "--stack", stack.name, "--json", str(out), *extra],
        cwd=ROOT, env=stack.env(), capture_output=True, text=True, timeout=120)
    warned = run("--renew-before", "400")
    assert warned.returncode == 1 and "the admin talosconfig expires on" in warned.stdout, output(warned)
    assert "(within 400 d)" in warned.stdout and "BEGIN" not in warned.stdout
    done = run()
    assert done.returncode == 0, output(done)
    return json.loads(out.read_text())[0]["zones"][0]["observation"]


def backup_credential_takes_snapshots_only(stack, tmp_path) -> None:
    """The stack's backup talosconfig, used with the real talosctl: an etcd snapshot, and nothing else."""
    config = tmp_path / "backup.talosconfig"
    config.write_text(stack.outputs(show_secrets=True)["backupTalosconfigs"]["dr"])
    config.chmod(0o600)

    def talosctl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["talosctl", "--talosconfig", str(config), "-n", NODE, "-e", NODE, *args],
                              capture_output=True, text=True, timeout=60)

    snap = talosctl("etcd", "snapshot", str(tmp_path / "etcd.db"))
    assert snap.returncode == 0 and "snapshot info: hash" in snap.stdout, output(snap)
    for refused in (("version",), ("service",), ("kubeconfig", str(tmp_path / "kc")), ("get", "machineconfig"),
                    ("service", "etcd", "restart"), ("dmesg",)):
        said = talosctl(*refused)
        assert said.returncode != 0 and "PermissionDenied" in output(said), (refused, output(said))


# --- CA rotation --------------------------------------------------------------------------------


def changes(log) -> dict:
    return {meta["urn"].rsplit("::", 1)[-1]: meta["op"] for e in events(log)
            if (meta := (e.get("resOutputsEvent") or {}).get("metadata") or {}) and meta.get("op") != "same"
            and "::pulumi:providers:" not in meta["urn"]}


def held(stack, resource: str, key: str) -> str:
    state = json.loads(stack.run("stack", "export", "--stack", stack.name, "--show-secrets").stdout)
    res = next(r for r in state["deployment"]["resources"] if r["urn"].endswith(f"::{resource}"))
    value = res["outputs"][key]
    value = value.get("plaintext", value) if isinstance(value, dict) else value
    return json.loads(value) if value.startswith('"') else value


def talos_works(client_of: str, server_cas: bytes) -> bool:
    """Whether the node takes the client certificate of talosconfig `client_of` (trusting `server_cas`)."""
    cert = tc.parse(client_of)
    text = tc.render("e2e-dr", [NODE], [NODE], server_cas, CertKey(cert.crt, cert.key))
    try:
        return bool(TalosClient.from_talosconfig(tc.parse(text), node=NODE, endpoint=NODE).version(timeout=T).tag)
    except TalosError:
        return False


def k8s_works(kubeconfig: str) -> bool:
    api = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))
    try:
        client.CoreV1Api(api).read_namespace("kube-system", _request_timeout=T)
        return True
    except Exception:  # noqa: BLE001 - refused (401) or untrusted server: both mean "does not work"
        return False
    finally:
        api.close()


class ApiPoller(threading.Thread):
    """GET /version of the zone's apiserver every 0.5 s (whichever CA serves); records outages."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop, self.outages, self.answered = threading.Event(), [], 0
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname, self.ctx.verify_mode = False, ssl.CERT_NONE  # only "does it answer"

    def run(self) -> None:
        down = None
        while not self.stop.wait(0.5):
            try:
                urllib.request.urlopen(f"https://{NODE}:6443/version", context=self.ctx, timeout=5).close()
                self.answered += 1
                if down is not None:
                    self.outages.append(round(time.monotonic() - down, 1))
                down = None
            except OSError:
                down = down if down is not None else time.monotonic()


def rotate_both_cas(stack, lab, z: dict, tmp_path) -> None:
    old_kubeconfig = stack.outputs(show_secrets=True)["kubeconfigs"]["dr"]
    old_talosconfig = held(stack, "e2e-dr-ca-rotation", "talosconfig")
    rotating = {**z, "certificates": {"rotate": {"talos": "2026-12", "kubernetes": "2026-12"}}}
    write_config(stack, lab, rotating)  # (backup.onUp off again: the backup resource updates once more)
    preview = stack.preview()
    plan = [line.strip() for line in preview.stdout.splitlines() if "CA rotation of e2e-dr:" in line]
    assert any("Talos API CA: 1. accept the new CA on every node (127.0.42.11)" in line for line in plan), \
        output(preview)
    assert any("Kubernetes CA: 4. drop the old CA" in line for line in plan), output(preview)
    assert "BEGIN" not in output(preview)

    poller = ApiPoller()
    poller.start()
    log = tmp_path / "rotate-killed.jsonl"
    proc, seen = kills.start(stack, "up", log), kills.EventLog(log)
    deadline = time.monotonic() + 300
    while not any("Talos API CA: swap done" in ((e.get("diagnosticEvent") or {}).get("message") or "")
                  for e in seen.new_events()):
        assert proc.poll() is None, proc.output.read_text()[-4000:]
        assert time.monotonic() < deadline, "the Talos CA swap never finished"
        time.sleep(0.01)
    kills.freeze(proc, stack)
    kills.kill(proc, stack)  # mid-rotation: the Talos CA swapped, the Kubernetes CA not dropped
    # The run goes on while the event is read: on a busy machine the Talos drop may have reached
    # the node before the kill. Old Talos credentials stop working then, and only then.
    killed = " ".join((e.get("diagnosticEvent") or {}).get("message") or "" for e in events(log))
    talos_dropped = "Talos API CA rotation, drop:" in killed
    both = tc.parse(old_talosconfig).ca + secrets.load(held(stack, "e2e-dr-secrets", "secretsYaml")).os.crt
    assert talos_works(old_talosconfig, both) or talos_dropped  # old client certificates still work
    assert k8s_works(old_kubeconfig)

    resumed = tmp_path / "rotate-resumed.jsonl"
    stack.up(f"--event-log={resumed}")
    said = " ".join((e.get("diagnosticEvent") or {}).get("message") or "" for e in events(resumed))
    assert "Talos API CA: accept done" not in said, said[-3000:]
    assert "Talos API CA: drop done" in said or talos_dropped, said[-3000:]
    assert "Kubernetes CA: drop done" in said
    # The new cluster CA in the kubeconfig updates the zone's provider in place (clusterIdentifier):
    # nothing it made on the cluster is replaced.
    replaced = {m["urn"].rsplit("::", 1)[-1] for path in (log, resumed) for e in events(path)
                for m in [((e.get("resourcePreEvent") or e.get("resOutputsEvent") or {}).get("metadata") or {})]
                if m.get("op") in ("replace", "create-replacement", "delete-replaced")}
    assert replaced == set(), replaced
    poller.stop.set()
    poller.join(10)
    assert poller.answered > 10 and max(poller.outages, default=0) < 10, poller.outages

    new_kubeconfig = stack.outputs(show_secrets=True)["kubeconfigs"]["dr"]
    new_talosconfig = held(stack, "e2e-dr-ca-rotation", "talosconfig")
    assert k8s_works(new_kubeconfig) and not k8s_works(old_kubeconfig)
    assert talos_works(new_talosconfig, tc.parse(new_talosconfig).ca) and not talos_works(old_talosconfig, both)
    assert ready(stack, "dr")
    again = tmp_path / "rotate-again.jsonl"
    stack.up(f"--event-log={again}")
    assert changes(again) == {}, changes(again)  # a second up is a no-op
