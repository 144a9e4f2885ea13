"""tools/debian-packages.sh on a machine without the DNS server: apt-get (a stand-in here) is
run only when a package is missing, after an `update` if the first try fails, and never
without root; it fails naming the package when the command still is not there."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "tools" / "debian-packages.sh"

FAKE_APT = r"""#!/bin/bash
echo "$*" >>"$APT_LOG"
case "$1" in
  update) [[ -n "$APT_NO_LISTS" ]] && touch "$APT_LISTS"; exit 0 ;;
  install)
    [[ -n "$APT_NO_LISTS" && ! -e "$APT_LISTS" ]] && { echo "E: Unable to locate package knot" >&2; exit 100; }
    [[ -n "$APT_BROKEN" ]] && exit 0
    for pkg in "${@:4}"; do
      case $pkg in knot) cmd=knotd ;; openssh-server) cmd=sshd ;; *) continue ;; esac
      printf '#!/bin/sh\n' >"$SBIN/$cmd"; chmod +x "$SBIN/$cmd"
    done ;;
esac
"""


@pytest.fixture
def machine(tmp_path):
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    apt = tmp_path / "apt-get"
    apt.write_text(FAKE_APT)
    apt.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KONTINUUM_APT_GET": str(apt),
           "KONTINUUM_SBIN_DIRS": str(sbin), "KONTINUUM_UID": "0", "APT_LOG": str(tmp_path / "apt.log"),
           "APT_LISTS": str(tmp_path / "lists"), "SBIN": str(sbin)}

    def run(**extra):
        r = subprocess.run([str(SCRIPT)], env={**env, **extra}, capture_output=True, text=True, timeout=30)
        log = Path(env["APT_LOG"])
        return r, log.read_text().splitlines() if log.exists() else []
    run.sbin = sbin
    return run


def test_missing_package_is_installed_once_then_left_alone(machine):
    r, calls = machine()
    assert r.returncode == 0, r.stderr
    assert calls == ["install -y --no-install-recommends knot openssh-server"]
    assert (machine.sbin / "knotd").exists() and (machine.sbin / "sshd").exists()
    r, calls = machine()
    assert r.returncode == 0 and calls == ["install -y --no-install-recommends knot openssh-server"]  # nothing more


def test_fresh_machine_without_package_lists_updates_first(machine):
    r, calls = machine(APT_NO_LISTS="1")
    assert r.returncode == 0, r.stderr
    assert calls == ["install -y --no-install-recommends knot openssh-server", "update", "install -y --no-install-recommends knot openssh-server"]


def test_without_root_it_says_what_to_run(machine):
    r, calls = machine(KONTINUUM_UID="1000")
    assert r.returncode == 1 and calls == []
    assert "sudo apt-get install -y knot" in r.stderr


def test_a_package_that_does_not_provide_the_command_fails_naming_it(machine):
    r, _ = machine(APT_BROKEN="1")
    assert r.returncode == 1 and "knot is installed but knotd is still not found" in r.stderr
