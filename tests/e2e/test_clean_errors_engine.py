"""An expected failure reads as one clear message through the real engine: a discovery that
finds nothing fails with what happened and what to do, with no Python traceback before it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab.hub import Hub
from lab.pulumi_cli import Stack

PROJECT = Path(__file__).parent / "projects" / "pools"
HUB_ADDRESS = "127.0.0.37"
DEAD = "127.0.37.30"  # nothing listens there: every probe is refused at once


@pytest.fixture(scope="module")
def hub(tools_bin, tmp_path_factory):
    h = Hub.on_free_ports(tmp_path_factory.mktemp("hub"), HUB_ADDRESS).start()
    yield h
    h.stop()


def test_failed_discovery_is_one_message_without_traceback(hub, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    stack = Stack(project, "e2e", tmp_path / "state", passphrase="e2e").init()
    stack.set_config("hubKubeconfig", hub.kubeconfig, secret=True)
    stack.set_config("instances", json.dumps([{"name": "dead-0", "interfaces": [DEAD], "probeTimeout": 2}]))
    stack.set_config("pools", "[]")
    result = stack.run("up", "--yes", "--skip-preview", check=False, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Instance dead-0: no address answered in maintenance mode" in out, out
    assert "Traceback" not in out and "File \"" not in out, out
    assert "warning:" not in out, out
