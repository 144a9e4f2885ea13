"""tools/plugins/plugin_guard.py: an exec'd plugin writes its temporary files (the kubernetes
plugin's kubeconfig with client keys) into a directory of its engine's own, and a later start
removes the directories of engines that are gone."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
GUARD = ROOT / "tools" / "plugins" / "plugin_guard.py"


def guard_module():
    spec = importlib.util.spec_from_file_location("plugin_guard", GUARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_dirs_of_gone_engines_are_removed_and_live_ones_kept(tmp_path):
    guard = guard_module()
    gone = tmp_path / f"{guard.TMP_PREFIX}{dead_pid()}"
    (gone / "sub").mkdir(parents=True)
    (gone / "kubeconfig123").write_text("keys")
    live = tmp_path / f"{guard.TMP_PREFIX}{os.getppid()}"
    live.mkdir()
    other = tmp_path / "kubeconfig456"  # not ours: left alone
    other.write_text("x")

    path = Path(guard.private_tmp(os.getpid(), base=str(tmp_path)))

    assert path == tmp_path / f"{guard.TMP_PREFIX}{os.getpid()}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert not gone.exists()
    assert live.exists() and other.exists()


def test_an_execd_plugin_gets_the_engines_directory_as_tmpdir(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    # The guard checks that its parent is the engine: here the parent is this shell's python.
    script = (f"import os, subprocess, sys; r = subprocess.run([sys.executable, {str(GUARD)!r}, str(os.getpid()), "
              "'exec', '/bin/sh', '-c', 'echo $TMPDIR'], capture_output=True, text=True); print(r.stdout.strip()); "
              "print(os.getpid())")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30)
    tmpdir, engine = out.stdout.split()
    assert tmpdir == str(tmp_path / f"kontinuum-plugins-{engine}")
    assert Path(tmpdir).is_dir()
