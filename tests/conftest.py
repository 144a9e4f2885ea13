"""Shared fixtures: the pinned tools on PATH and a throwaway real kube-apiserver."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tools_bin() -> Path:
    """The pinned tool directory, first on PATH; `make test` builds it, so a missing tool fails."""
    out = subprocess.run([str(ROOT / "tools" / "install.sh"), "--print-bin"], capture_output=True, text=True, check=True)
    bin_dir = Path(out.stdout.strip())
    missing = [t for t in ("pulumi", "etcd", "kube-apiserver") if not (bin_dir / t).exists()]
    if missing:
        pytest.fail(f"pinned tools missing from {bin_dir}: {', '.join(missing)}; run `make tools`")
    # The pinned upstream charts and CRDs where stacks/Pulumi.lab.yaml names them (as `lab up` links them).
    from lab import upstream

    upstream.link(ROOT / ".state" / "lab" / "upstream")
    mp = pytest.MonkeyPatch()
    mp.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    yield bin_dir
    mp.undo()


@pytest.fixture(scope="module")
def apiserver(tools_bin: Path, tmp_path_factory):
    """A real etcd, kube-apiserver and controller-manager (garbage collection finishes the
    foreground deletions pulumi-kubernetes asks for) on 127.0.0.1 with generated certificates."""
    from lab.controlplane import ClusterPKI, ControlPlane, free_port

    cp = ControlPlane(
        "test",
        tmp_path_factory.mktemp("apiserver"),
        ClusterPKI.generate(),
        apiserver_port=free_port(),
        etcd_ports=(free_port(), free_port()),
        controllers=True,
        controller_ports=(free_port(), free_port()),
    ).start()
    yield cp
    cp.stop()
