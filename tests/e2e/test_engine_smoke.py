"""The pinned engine, language host, dynamic-provider host and kubernetes plugin, end to end,
through tools/pulumi's launchers: the language host (whose `pip list` host-python answers) still
finds the kubernetes plugin at the pinned version, and what `recover` reads from the file backend
without the engine is what the engine exports."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config as kconfig

from kontinuum import file_backend, recover
from lab.pulumi_cli import ROOT, Stack

PROJECT = Path(__file__).parent / "projects" / "engine_smoke"
PINS = dict(re.findall(r"^([A-Z_]+)=(\S+)$", (ROOT / "tools" / "versions.env").read_text(), re.M))


def _core(kubeconfig: str) -> client.CoreV1Api:
    return client.CoreV1Api(kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig)))


def check_reads_without_the_engine(stack: Stack, exported: dict, monkeypatch) -> None:
    """The checkpoint file is the engine's export, and the workspace names the stack `stack init`
    selected: `recover` needs no engine for either."""
    backend = stack.env()["PULUMI_BACKEND_URL"]
    assert file_backend.checkpoint(backend, "engine-smoke", stack.name) == exported
    for k in ("PULUMI_BACKEND_URL", "PULUMI_HOME"):
        monkeypatch.setenv(k, stack.env()[k])
    monkeypatch.delenv("PULUMI_STACK", raising=False)
    monkeypatch.setattr(recover, "engine", lambda *a, **kw: pytest.fail(f"the engine was started: {a}"))
    assert recover.selected_stack(stack.project_dir.resolve()).rsplit("/", 1)[-1] == stack.name
    assert recover.recover(None, stack.project_dir.resolve(), log=lambda m: None) == exported


def test_preview_up_noop_destroy(apiserver, tmp_path, monkeypatch):
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    kubeconfig = apiserver.admin_kubeconfig()
    stack = Stack(project, "smoke", tmp_path / "state", passphrase="smoke-test").init()
    stack.set_config("kubeconfig", kubeconfig, secret=True)
    core = _core(kubeconfig)

    preview = stack.preview()
    assert "create" in preview.stdout
    assert "BEGIN" not in preview.stdout + preview.stderr  # no key material in the plan

    stack.up()
    cm = core.read_namespaced_config_map("engine-smoke", "default")
    assert cm.data == {"greeting": "hello smoke"}
    # What tests read without starting the CLI is what the CLI prints.
    cli = json.loads(stack.run("stack", "output", "--stack", stack.name, "--json").stdout)
    assert stack.outputs() == cli and cli["greeting"] == "hello smoke" and cli["token"] == "[secret]", cli
    exported = json.loads(stack.run("stack", "export", "--stack", stack.name).stdout)
    assert stack.export() == exported
    # The kubernetes plugin ran at the pinned version: ambient plugins and downloads are off, so the
    # engine could only load the entry tools/pulumi wrote for that version (our launcher).
    providers = [r for r in exported["deployment"]["resources"] if r["type"] == "pulumi:providers:kubernetes"]
    assert [r["inputs"].get("version") for r in providers] == [PINS["PULUMI_KUBERNETES_VERSION"]], providers
    entry = (tmp_path / "state" / "pulumi-home" / "plugins" / f"resource-kubernetes-v{PINS['PULUMI_KUBERNETES_VERSION']}"
             / "pulumi-resource-kubernetes")
    assert "tools/plugins/pulumi-resource-kubernetes" in entry.read_text()
    check_reads_without_the_engine(stack, exported, monkeypatch)

    again = stack.up("--expect-no-changes")
    assert again.returncode == 0

    stack.destroy()
    with pytest.raises(client.ApiException) as gone:
        core.read_namespaced_config_map("engine-smoke", "default")
    assert gone.value.status == 404
