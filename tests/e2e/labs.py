"""The embedded lab for an e2e module: started through `python -m lab` in a state directory of
its own, on the module's own loopback addresses, and always taken down again."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from lab.pulumi_cli import ROOT


def lab_cli(state: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", "--state-dir", str(state), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@contextmanager
def running_lab(state: Path, *, nodes: int, first_address: str, hub_address: str, ttl: float = 1800,
                acme_address: str = ""):
    """Yields the state directory; `lab down` must leave nothing running. With an ACME address
    the lab runs Pebble and real cert-manager (lab/supervisor.py)."""
    up = lab_cli(state, "up", "--nodes", str(nodes), "--first-address", first_address,
                 "--hub-address", hub_address, "--acme-address", acme_address, "--ttl", str(ttl))
    try:
        assert up.returncode == 0, f"lab up failed:\n{up.stdout}\n{up.stderr}"
        yield state
    finally:
        down = lab_cli(state, "down")
        assert down.returncode == 0, f"lab down left processes behind:\n{down.stdout}\n{down.stderr}"
