"""etcd backup and restore through the operator CLI on a zone the real engine brought up (issue 18):
`python -m kontinuum backup` reads the zone from the stack's state, `restore` refuses a healthy
etcd, `--force` brings the snapshot back, the next `pulumi up` changes nothing but what
`backup.onUp` asks for: one backup per up. Its own lab: node 127.0.42.11, hub 127.0.0.42."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum.backup import files
from lab.pulumi_cli import ROOT
from tests.e2e.cluster_lab import events, new_stack, output, ready, write_config, zone
from tests.e2e.labs import running_lab

NODE = "127.0.42.11"
T = 10


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    with running_lab(tmp_path_factory.mktemp("backup-lab"), nodes=1, first_address=NODE,
                     hub_address="127.0.0.42") as state:
        yield state


def cli(stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kontinuum", *args, "--stack", stack.name, "--zone", "dr"],
                          cwd=ROOT, env=stack.env(), capture_output=True, text=True, timeout=300)


def configmaps(core: client.CoreV1Api) -> set[str]:
    return {c.metadata.name for c in core.list_namespaced_config_map("default", _request_timeout=T).items
            if c.metadata.name.startswith("dr-")}


def test_backup_restore_and_backup_on_up(lab, tmp_path):
    backups = tmp_path / "backups"
    z = {**zone("dr", [NODE]), "backup": {"directory": str(backups), "keep": 2}}
    stack = new_stack(tmp_path, lab, z)
    stack.up()
    assert ready(stack, "dr")
    folder = files.zone_directory(backups, stack.name, "e2e-dr")
    assert files.backups(folder, "e2e-dr") == []  # no onUp: no backup yet

    kubeconfig = stack.outputs(show_secrets=True)["kubeconfigs"]["dr"]
    api = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", {"metadata": {"name": "dr-a"}}, _request_timeout=T)
    taken = cli(stack, "backup")
    assert taken.returncode == 0, output(taken)
    path = taken.stdout.strip()
    assert files.backups(folder, "e2e-dr") == [folder / path.rsplit("/", 1)[-1]]
    assert "BEGIN" not in output(taken)  # no key or certificate printed
    core.create_namespaced_config_map("default", {"metadata": {"name": "dr-b"}}, _request_timeout=T)

    refused = cli(stack, "restore", "--snapshot", path)
    assert refused.returncode == 1 and "etcd is healthy on 127.0.42.11" in refused.stderr, output(refused)
    restored = cli(stack, "restore", "--snapshot", path, "--force")
    assert restored.returncode == 0, output(restored)
    assert "1. wipe etcd data" in restored.stderr and "done; etcd is back" in restored.stderr
    api.close()
    api = kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig))  # the same credentials still work
    assert configmaps(client.CoreV1Api(api)) == {"dr-a"}
    api.close()

    # The restore changed nothing the stack holds: switching onUp on, the next up updates the
    # backup resource (which takes a backup) and nothing else.
    write_config(stack, lab, {**z, "backup": {**z["backup"], "onUp": True}})
    log = tmp_path / "events.jsonl"
    stack.up(f"--event-log={log}")
    changed = {meta["urn"].rsplit("::", 1)[-1]: meta["op"] for e in events(log)
               if (meta := (e.get("resOutputsEvent") or {}).get("metadata") or {}) and meta.get("op") != "same"
               and "::pulumi:providers:" not in meta["urn"]}  # the engine's provider bookkeeping
    assert changed == {"e2e-dr-etcd-backup": "update"}, changed
    kept = files.backups(folder, "e2e-dr")
    assert len(kept) == 2 and kept[0].name == path.rsplit("/", 1)[-1], kept  # the CLI's and the up's
    assert ready(stack, "dr")
