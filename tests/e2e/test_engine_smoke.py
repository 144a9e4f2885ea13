"""The pinned engine, language host, dynamic-provider host and kubernetes plugin, end to end."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config as kconfig

from lab.pulumi_cli import Stack

PROJECT = Path(__file__).parent / "projects" / "engine_smoke"


def _core(kubeconfig: str) -> client.CoreV1Api:
    return client.CoreV1Api(kconfig.new_client_from_config_dict(yaml.safe_load(kubeconfig)))


def test_preview_up_noop_destroy(apiserver, tmp_path):
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
    assert stack.outputs()["greeting"] == "hello smoke"

    again = stack.up("--expect-no-changes")
    assert again.returncode == 0

    stack.destroy()
    with pytest.raises(client.ApiException) as gone:
        core.read_namespaced_config_map("engine-smoke", "default")
    assert gone.value.status == 404
