"""Region stacks on a shared S3 state backend (issue 20), against a real S3 server on loopback
(SeaweedFS, 127.0.44.201), with the key-file secrets setup CI uses (PULUMI_CONFIG_PASSPHRASE_FILE;
no passphrase in the environment or the repo):

- two concurrent ups of one region: the second is refused by the backend's lock, with a message
  naming the holder, and the first one's state is intact;
- two regions run in parallel;
- a killed run's lock refuses the next up until `pulumi cancel`; then the up converges.

The program is a stand-in (tests/e2e/projects/shared_backend): what is under test is the
backend, its lock and the secrets provider, which every region stack shares.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lab.pulumi_cli import Stack
from lab.s3 import running_s3
from tests.e2e.cluster_lab import up_in_background, wait_for_event

PROJECT = Path(__file__).parent / "projects" / "shared_backend"
S3_ADDRESS = "127.0.44.201"
HOLD = 30.0  # seconds an up holds its stack's lock (a second run must reach the lock check meanwhile)


@pytest.fixture(scope="module")
def s3(tools_bin, tmp_path_factory):
    if shutil.which("weed", path=str(tools_bin)) is None:
        pytest.skip("weed is not built: `tools/install.sh weed`")
    with running_s3(tmp_path_factory.mktemp("s3"), address=S3_ADDRESS) as server:
        yield server


class SharedStack(Stack):
    """A stack on the S3 backend, its passphrase only in a file (as CI writes it)."""

    s3 = None
    passphrase_file: Path | None = None

    def env(self) -> dict[str, str]:
        env = super().env()
        env.pop("PULUMI_CONFIG_PASSPHRASE")
        env.update(PULUMI_BACKEND_URL=self.s3.backend_url(), PULUMI_CONFIG_PASSPHRASE_FILE=str(self.passphrase_file),
                   PULUMI_DEBUG_COMMANDS="true", **self.s3.env())  # the engine's --event-log needs the last
        return env

    def init(self) -> "SharedStack":
        self.run("stack", "init", self.name, "--secrets-provider", "passphrase")
        return self


@pytest.fixture(scope="module")
def project(s3, tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    shutil.copytree(PROJECT, root / "project")
    key = root / "passphrase"
    key.write_text(os.urandom(24).hex())
    key.chmod(0o600)

    def stack(name: str) -> SharedStack:
        s = SharedStack(root / "project", name, root / f"home-{name}", passphrase="unused")
        s.s3, s.passphrase_file = s3, key
        return s

    deadline = time.monotonic() + 60
    while True:  # the gateway accepts connections before its bucket is ready
        r = stack("eu").run("stack", "ls", "--json", check=False, timeout=60)
        if r.returncode == 0:
            break
        assert time.monotonic() < deadline, r.stderr
        time.sleep(1)
    stacks = {name: stack(name).init() for name in ("eu", "us")}
    for name, s in stacks.items():
        s.set_config("hold", str(HOLD))
        s.set_config("token", f"token-of-{name}", secret=True)
    return stacks, key


def holding(stack: Stack, log: Path) -> subprocess.Popen:
    """An up that has taken the stack's lock: its hold resource is being created or updated."""
    proc = up_in_background(stack, log)
    wait_for_event(proc, log, "resourcePreEvent", f"{stack.name}-hold", timeout=180)
    return proc


def test_two_ups_of_one_region_the_second_is_refused_and_no_state_is_lost(project, tmp_path):
    stacks, key = project
    eu, us = stacks["eu"], stacks["us"]
    first = holding(eu, tmp_path / "eu.log")
    parallel = holding(us, tmp_path / "us.log")  # another region: its own lock, held at the same time
    t0 = time.monotonic()
    second = eu.run("up", "--yes", "--skip-preview", check=False, timeout=120)
    refused_in = time.monotonic() - t0
    out = second.stdout + second.stderr
    assert second.returncode != 0 and "the stack is currently locked by 1 lock(s)" in out, out
    assert "pulumi cancel" in out and "pid" in out  # who holds it, and the way out
    assert refused_in < 60
    assert first.poll() is None  # the holder still runs, undisturbed
    out_first, _ = first.communicate(timeout=300)
    out_us, _ = parallel.communicate(timeout=300)
    assert first.returncode == 0, out_first[-3000:]
    assert parallel.returncode == 0, out_us[-3000:]
    assert eu.outputs(show_secrets=True) == {"generation": 1, "token": "token-of-eu"}
    assert us.outputs(show_secrets=True) == {"generation": 1, "token": "token-of-us"}
    exported = json.dumps(eu.export())
    assert "token-of-eu" not in exported and key.read_text() not in exported  # secrets stay encrypted


def test_a_killed_run_leaves_a_lock_that_cancel_clears(project, tmp_path):
    stacks, _ = project
    eu = stacks["eu"]
    eu.set_config("generation", "2")
    run = holding(eu, tmp_path / "killed.log")  # the update is under way
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate()
    refused = eu.run("up", "--yes", "--skip-preview", check=False, timeout=120)
    out = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "currently locked" in out and "pulumi cancel" in out, out
    eu.run("cancel", "--yes")
    eu.up(timeout=300)
    assert eu.outputs(show_secrets=True) == {"generation": 2, "token": "token-of-eu"}
    eu.preview("--expect-no-changes")
