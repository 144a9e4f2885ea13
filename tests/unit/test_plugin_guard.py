"""kontinuum-plugin-guard (tools/plugin-guard), which execs the Go plugins: an exec'd plugin writes
its temporary files (the kubernetes plugin's kubeconfig with client keys) into a directory of
its engine's own, a later start removes the directories of engines that are gone, and a guard
whose engine is already gone starts nothing."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PREFIX = "kontinuum-plugins-"

# A stand-in engine: runs the guard as its child (the guard checks that its parent is the engine)
# and prints the child's output, then its own pid.
ENGINE = ("import os, subprocess, sys; r = subprocess.run([*sys.argv[1:2], str(os.getpid()), *sys.argv[2:]], "
          "capture_output=True, text=True); print(r.stdout.strip() or r.stderr.strip()); print(r.returncode); "
          "print(os.getpid())")


@pytest.fixture(scope="module")
def guard() -> Path:
    out = subprocess.run([str(ROOT / "tools" / "install.sh"), "--print-bin"], capture_output=True, text=True, check=True)
    path = Path(out.stdout.strip()) / "kontinuum-plugin-guard"
    if not path.exists():
        pytest.fail(f"{path} is missing; run `make tools` (or `tools/install.sh kontinuum-plugin-guard`)")
    return path


def under_engine(guard: Path, *args: str, env: dict) -> tuple[str, int, int]:
    """(the plugin's output, the guard's exit code, the stand-in engine's pid)."""
    out = subprocess.run([sys.executable, "-c", ENGINE, str(guard), *args], env=env, capture_output=True, text=True,
                         timeout=30)
    *text, code, engine = out.stdout.rstrip("\n").split("\n")
    return "\n".join(text), int(code), int(engine)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_an_execd_plugin_gets_its_engines_own_directory_as_tmpdir(guard, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    tmpdir, code, engine = under_engine(guard, "exec", "/bin/sh", "-c", "echo $TMPDIR; echo $$ $PPID", env=env)
    assert code == 0
    tmpdir = tmpdir.splitlines()[0]
    assert tmpdir == str(tmp_path / f"{PREFIX}{engine}")
    assert stat.S_IMODE(Path(tmpdir).stat().st_mode) == 0o700


def test_dirs_of_gone_engines_are_removed_and_live_ones_and_others_kept(guard, tmp_path):
    gone = tmp_path / f"{PREFIX}{dead_pid()}"
    (gone / "sub").mkdir(parents=True)
    (gone / "kubeconfig123").write_text("keys")
    live = tmp_path / f"{PREFIX}{os.getpid()}"  # this test's process: alive
    live.mkdir()
    other = tmp_path / "kubeconfig456"  # not ours: left alone
    other.write_text("x")
    odd = tmp_path / f"{PREFIX}+{dead_pid()}"  # not a pid after the prefix: not ours either
    odd.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    _, code, _ = under_engine(guard, "exec", "/bin/true", env=env)
    assert code == 0
    assert not gone.exists()
    assert live.exists() and other.exists() and odd.exists()


def test_a_guard_whose_parent_is_not_the_engine_starts_nothing(guard, tmp_path):
    marker = tmp_path / "started"
    # the engine pid given is one that is gone: as if the engine died before the guard ran
    out = subprocess.run([str(guard), str(dead_pid()), "exec", "/bin/sh", "-c", f"touch {marker}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "is gone; not starting" in out.stderr
    assert not marker.exists()


def test_usage_and_version(guard):
    assert subprocess.run([str(guard)], capture_output=True, timeout=30).returncode == 2
    version = subprocess.run([str(guard), "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    assert len(version) == 12 and guard.resolve().parent.name == version  # cached under its source hash
