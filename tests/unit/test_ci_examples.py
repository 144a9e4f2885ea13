"""The CI examples in ci/ (issue 20): they parse, run the preview command the e2e test runs
(tests/e2e/test_ci_engine.py) with flags the CLI accepts, and take every secret from the CI's
secret store."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import yaml

from kontinuum.cli import preview

ROOT = Path(__file__).parents[2]
FILES = sorted((ROOT / "ci").glob("*.yml"))


def test_there_are_examples_for_two_ci_systems():
    assert [f.name for f in FILES] == ["github-actions.yml", "gitlab-ci.yml"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_preview_command_is_the_tested_one(path):
    text = path.read_text()
    yaml.safe_load(text)
    (line,) = {m.group(0) for m in re.finditer(r"venv/bin/python -m kontinuum preview [^\n$]*", text)}
    argv = shlex.split(line.replace("\\", ""))[4:]
    parser = argparse.ArgumentParser()
    preview.add_arguments(parser)
    args = parser.parse_args(argv)  # SystemExit on a flag the CLI does not know
    assert args.all and args.markdown and args.json
    assert "--refresh --expect-no-changes" in text  # the drift job
    assert "tools/pulumi --non-interactive up --yes --stack" in text


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_secrets_come_from_the_ci_store(path):
    text = path.read_text()
    for key in ("AWS_SECRET_ACCESS_KEY", "PASSPHRASE"):
        for m in re.finditer(rf"{key}\S*:\s*([^\n}}]+)", text):
            value = m.group(1).strip().strip("\"'")
            assert value.startswith(("${{ secrets.", "$KONTINUUM_")), m.group(0)
    assert "PULUMI_CONFIG_PASSPHRASE:" not in text  # only ever the file


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_nightly_job_takes_and_verifies_backups_and_runs_status(path):
    from kontinuum.cli import backup, status

    text = path.read_text()
    for command, module in (("backup", backup), ("status", status)):
        lines = {m.group(0) for m in re.finditer(rf"venv/bin/python -m kontinuum {command} [^\n;|]*", text)}
        assert lines, command
        for line in lines:
            parser = argparse.ArgumentParser()
            module.add_arguments(parser)
            args = parser.parse_args(["x" if a.startswith("$") else a for a in shlex.split(line)[4:]])
            assert command != "backup" or args.verify
    assert "tools/install.sh etcd" in text and "AWS_SHARED_CREDENTIALS_FILE" in text  # the backups' own key


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_release_job_runs_the_staged_rollout_and_keeps_its_progress(path):
    from kontinuum import rollout_plan
    from kontinuum.cli import rollout

    text = path.read_text()
    (line,) = {m.group(0) for m in re.finditer(r"venv/bin/python -m kontinuum rollout [^\n;\\]*(\\\n[^\n;]*)?", text)}
    argv = shlex.split(line.replace("\\\n", " "))[4:]
    parser = argparse.ArgumentParser()
    rollout.add_arguments(parser)
    args = parser.parse_args(argv)
    fleet = rollout_plan.load_fleet(ROOT / args.fleet)
    assert [w.stacks for w in fleet.waves] == [["eu"], ["us"]]  # the regions the up jobs name
    assert fleet.settings["stacksDir"] == ROOT / "stacks"
    assert args.markdown and args.json and str(args.state) == "rollout.state.json" and args.logs
    # Restored before the run and kept after it, a failed run too (GitHub: cache/restore + cache/save
    # if: always(); GitLab: a cache saved `when: always`).
    assert "actions/cache/save@v4" in text and "if: always()" in text if "github" in path.name else \
        re.search(r"paths: \[rollout.state.json\]\n\s+when: always", text)
    assert f"{args.logs}/" in text.split("venv/bin/python -m kontinuum rollout", 1)[1]  # kept as an artifact
