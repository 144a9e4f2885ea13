"""tools/pulumi finds the tool directory without running tools/install.sh on every call: it
remembers install.sh's answer per checkout and asks again once a file the answer is made of, or
the environment it reads, changes. A throwaway checkout with a stand-in engine."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


class Checkout:
    def __init__(self, root: Path):
        self.root = root
        tools = root / "tools"
        shutil.copytree(ROOT / "tools" / "plugin-guard", tools / "plugin-guard")
        for f in ("pulumi", "install.sh", "versions.env"):
            shutil.copy2(ROOT / "tools" / f, tools / f)
        self.env = {"HOME": str(root / "home"), "PATH": "/usr/bin:/bin", "KONTINUUM_TOOLS_CACHE": str(root / "cache"),
                    "KONTINUUM_STATE": str(root / "state")}

    def bin(self, **env: str) -> Path:
        out = subprocess.run([str(self.root / "tools" / "install.sh"), "--print-bin"], env={**self.env, **env},
                             capture_output=True, text=True, check=True)
        return Path(out.stdout.strip())

    def provide(self, **env: str) -> None:
        """A stand-in engine and guard in the tool directory."""
        b = self.bin(**env)
        b.mkdir(parents=True, exist_ok=True)
        (b / "pulumi").write_text('#!/bin/sh\necho "engine $*"\n')
        (b / "kontinuum-plugin-guard").write_text("#!/bin/sh\n")
        for f in ("pulumi", "kontinuum-plugin-guard"):
            (b / f).chmod(0o755)

    def pulumi(self, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.root / "tools" / "pulumi"), "version"], env={**self.env, **env},
                              capture_output=True, text=True, timeout=60)

    @property
    def memo(self) -> Path:
        return self.root / ".state" / "tools-bin"


@pytest.fixture
def checkout(tmp_path) -> Checkout:
    c = Checkout(tmp_path / "checkout")
    c.provide()
    return c


def test_the_answer_of_install_sh_is_remembered(checkout):
    assert checkout.pulumi().stdout == "engine version\n"
    assert checkout.memo.read_text().splitlines()[1] == str(checkout.bin())
    # a remembered directory is used as it is: here one without an engine
    key = checkout.memo.read_text().splitlines()[0]
    checkout.memo.write_text(f"{key}\n{checkout.root / 'elsewhere'}\n")
    out = checkout.pulumi()
    assert out.returncode == 1 and "run `make tools` first" in out.stderr


@pytest.mark.parametrize("changed", ["tools/versions.env", "tools/plugin-guard/main.go", "tools/install.sh"])
def test_a_changed_input_asks_install_sh_again(checkout, changed):
    assert checkout.pulumi().returncode == 0
    key = checkout.memo.read_text().splitlines()[0]
    checkout.memo.write_text(f"{key}\n{checkout.root / 'elsewhere'}\n")
    time.sleep(0.02)
    path = checkout.root / changed
    path.write_text(path.read_text() + ("\nKONTINUUM_TEST_PIN=1\n" if changed.endswith(".env") else "\n# changed\n"))
    if changed != "tools/install.sh":
        checkout.provide()  # the pins changed: a new tool directory
    out = checkout.pulumi()
    assert out.returncode == 0, out.stderr
    assert checkout.memo.read_text().splitlines()[1] == str(checkout.bin())


def test_another_tool_cache_in_the_environment_asks_again(checkout, tmp_path):
    assert checkout.pulumi().returncode == 0
    other = {"KONTINUUM_TOOLS_CACHE": str(tmp_path / "other-cache")}
    checkout.provide(**other)
    assert checkout.pulumi(**other).returncode == 0
    assert checkout.memo.read_text().splitlines()[1] == str(checkout.bin(**other))
    assert str(tmp_path / "other-cache") in checkout.memo.read_text()

