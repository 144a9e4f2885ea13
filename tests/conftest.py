"""Shared fixtures: the pinned tools on PATH and a throwaway real kube-apiserver."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.figures"]  # the suite's own figures, when asked for (bench/suite.py)

# Modules that bind the same loopback addresses (a lab's nodes, hub, DNS or ACME server) must
# not run at the same time: with `pytest -n N --dist loadgroup` (make test) each group runs in one
# worker, one module after the other. Every other module is a group of its own, so its
# module-scoped labs are never started twice.
SHARED_ADDRESSES = {
    "lab33": ("e2e/ha_zone/test_talos_cluster_engine.py", "e2e/ha_zone/test_zone_edits_engine.py",
              "e2e/ha_zone/test_zone_losses_engine.py"),  # the HA zone's lab
    "net21": ("e2e/test_pools_engine.py", "integration/test_talos_api.py", "integration/test_talos_providers.py"),
    "net9": ("integration/test_inventory.py", "integration/test_members.py", "integration/test_registry_join.py"),
    "lab-defaults": ("integration/test_lab_cli.py", "integration/test_lab_clusters.py", "integration/test_hub_crds.py",
                     "integration/test_downstream_footprint.py"),
    "net40": ("e2e/test_exposure_engine.py", "integration/test_dns_rfc2136.py", "integration/test_gateway_standin.py"),
    "net41": ("e2e/test_day2_engine.py", "integration/test_talos_upgrade.py"),
    "net42": ("e2e/test_backup_engine.py", "integration/test_etcd_recovery.py", "integration/test_talos_ca_phases.py"),
    "net43": ("e2e/test_flux_engine.py", "integration/test_flux_lab.py"),
    "net44": ("e2e/test_ci_engine.py", "e2e/test_shared_backend_engine.py"),
}
GROUP_OF = {module: group for group, modules in SHARED_ADDRESSES.items() for module in modules}
# The longest serial groups start first, one per worker: the kill chains (two modules of ~15 min,
# each with a lab of its own) and the HA zone's modules (tests/e2e/ha_zone/). Every other group keeps
# xdist's own order (most tests first); `make test` passes --no-loadscope-reorder so that this
# order holds. xdist also hands a worker whose first group has at most two tests a second group at
# once, which then waits behind it: the smallest unit-test modules go there, not a long group.
FIRST = ("e2e/test_kills_create_engine.py", "e2e/test_kills_delete_engine.py", "lab33")


def run_order(groups: dict[str, int]) -> list[str]:
    """Groups (name → number of tests) in the order they are handed out."""
    rest = sorted((g for g in groups if g not in FIRST), key=lambda g: -groups[g])
    behind = sorted((g for g in rest if g.startswith("unit/")), key=lambda g: groups[g])[:len(FIRST)]
    return [g for g in FIRST if g in groups] + behind + [g for g in rest if g not in behind]


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the marker into the item's group
def pytest_collection_modifyitems(items):
    group_of = {}
    for item in items:
        module = Path(item.fspath).resolve().relative_to(ROOT / "tests").as_posix()
        group_of[item.nodeid] = GROUP_OF.get(module, module)
        item.add_marker(pytest.mark.xdist_group(group_of[item.nodeid]))
    size: dict[str, int] = {}
    for group in group_of.values():
        size[group] = size.get(group, 0) + 1
    rank = {g: i for i, g in enumerate(run_order(size))}
    items.sort(key=lambda item: rank[group_of[item.nodeid]])  # stable: a module's tests keep their order


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
    from lab.acme import ensure_ca

    upstream.link(ROOT / ".state" / "lab" / "upstream")
    # stacks/Pulumi.lab.yaml's hub.acme.caBundleFile: the lab ACME CA, which a lab with an ACME
    # server makes on first use; a fresh clone's first modules may run labs without one.
    ensure_ca(ROOT / ".state" / "lab" / "acme")
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
