"""A record-only update keeps its outputs known at preview (issue 31), through the real engine
and the repo's dynamic-provider host: a zone's credential chain (TalosSecrets -> CaRotation ->
a resource reading the bundle and talosconfig, tests/e2e/projects/credential_record) edited as
an operator would. Each preview plans exactly the steps its up makes; no node or zone needed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lab.pulumi_cli import Stack
from tests.e2e.exact import compare

PROJECT = Path(__file__).parents[1] / "e2e" / "projects" / "credential_record"
SECRETS, ROTATION = "talos:TalosSecrets::rec-secrets", "talos:CaRotation::rec-ca-rotation"
READER = "pulumi-python:dynamic:Resource::rec-reader"


@pytest.fixture
def stack(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    s = Stack(project, "rec", tmp_path / "state", passphrase="it-rec",
              extra_env={"PULUMI_DEBUG_COMMANDS": "true"}).init()
    s.set_config("rotate", '{"talos": "2026-12"}')
    s.up()
    yield s
    s.destroy()


def test_record_only_edits_preview_exactly_their_up(stack, tmp_path):
    log = tmp_path / "events.jsonl"
    # The rotation block deleted after its rotation: both record it, nothing reads anything new.
    stack.run("config", "rm", "rotate")
    assert compare(stack, log)[0] == {("update", f"pulumi-python:dynamic/{SECRETS}"),
                                      ("update", f"pulumi-python:dynamic/{ROTATION}")}
    stack.preview("--expect-no-changes")
    # A renewal window moved, no certificate due: nothing to do at all.
    stack.set_config("renewBefore", "45")
    assert compare(stack, log)[0] == set()
    # A window that makes the admin certificate due: the talosconfig really changes, and so does
    # what reads it (and nothing else).
    stack.set_config("renewBefore", "4000")
    plan, _ = compare(stack, log)
    assert plan == {("update", f"pulumi-python:dynamic/{SECRETS}"), ("update", f"pulumi-python:dynamic/{ROTATION}"),
                    ("update", READER)}, plan
