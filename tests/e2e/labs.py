"""The embedded lab for an e2e module: started through `python -m lab` in a state directory of
its own, on the module's own loopback addresses, and always taken down again."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import yaml

from lab import upstream
from lab.pulumi_cli import ROOT
from tests import figures

LAB_STACK = ROOT / "stacks" / "Pulumi.lab.yaml"
# Our own minimal cert-manager chart (no webhooks), for labs without an ACME server: there the
# certificate issuer stand-in plays issuance, and the upstream chart's webhooks (served by the
# real webhook only in labs with ACME) would refuse cert-manager's objects.
STANDIN_CERT_MANAGER_CHART = ROOT / "lab" / "charts" / "cert-manager-standin"


def lab_cli(state: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", "--state-dir", str(state), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@contextmanager
def running_lab(state: Path, *, nodes: int, first_address: str, hub_address: str, ttl: float = 5400,
                acme_address: str = ""):
    """Yields the state directory; `lab down` must leave nothing running. With an ACME address
    the lab runs Pebble and real cert-manager (lab/supervisor.py). The time-to-live only stops a
    lab whose test run died: it covers a whole CI run (90 min), since a module sharing its lab
    takes 30 min and more on a busy machine."""
    up = lab_cli(state, "up", "--nodes", str(nodes), "--first-address", first_address,
                 "--hub-address", hub_address, "--acme-address", acme_address, "--ttl", str(ttl))
    try:
        assert up.returncode == 0, f"lab up failed:\n{up.stdout}\n{up.stderr}"
        yield state
    finally:
        down = lab_cli(state, "down")
        figures.lab_stopped(state)
        assert down.returncode == 0, f"lab down left processes behind:\n{down.stdout}\n{down.stderr}"


def lab_stack_config(state: Path) -> dict:
    """stacks/Pulumi.lab.yaml for the lab in `state`: its hub, the pinned upstream charts and CRDs,
    and, when the lab runs Pebble, its ACME directory and CA; otherwise our stand-in cert-manager
    chart (see STANDIN_CERT_MANAGER_CHART)."""
    cfg = yaml.safe_load(LAB_STACK.read_text())["config"]
    cfg["kontinuum:hubKubeconfigFile"] = str(state / "hub" / "kubeconfig")
    links = upstream.link(state / "upstream")
    addons = cfg["kontinuum:defaults"]["addons"]
    addons["cilium"]["chart"] = {"path": str(links["cilium"])}
    addons["gatewayApi"]["source"] = str(links["gateway-api"])
    acme = json.loads((state / "status.json").read_text()).get("acme")
    if acme:
        addons["certManager"]["chart"] = {"path": str(links["cert-manager"])}
        cfg["kontinuum:hub"]["acme"] = {**cfg["kontinuum:hub"]["acme"], "server": acme["directory"],
                                        "caBundle": Path(acme["caBundle"]).read_text()}
    else:
        addons["certManager"] = {"chart": {"path": str(STANDIN_CERT_MANAGER_CHART)}}
    return cfg
