"""The GitOps hand-off (issue 19, seed 002) through `pulumi up` on the lab: a zone with `flux`
comes up with the REAL Flux Operator reconciling FluxInstance `flux` against the zone's
apiserver, syncing from a Git server on loopback; switching to the fallback source and back,
suspending the apps and resuming them, a FluxInstance changed by hand (drift, repaired),
retiring a credential (after the sync proved the current source), removing `flux` (uninstalled)
and, bootstrapped again with `handOver`, dropping it (Flux keeps running) each change exactly
that, and a second run after each step plans nothing.

One lab for the module: node 127.0.43.21, hub 127.0.0.43, Git servers 127.0.43.202 (the
primary, token-protected) and 127.0.43.203 (the read-only backup). Tests run in file order.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from kontinuum.kube.clients import api_client
from lab import flux_operator
from lab.git_server import GitServer, init_repo
from lab.process import wait_until
from lab.pulumi_cli import ROOT, Stack
from tests.e2e.labs import lab_stack_config, running_lab

NODE, HUB = "127.0.43.21", "127.0.0.43"
TOKEN = "lab-primary-token-7f3a9c"  # the primary Git server's password: must never show in state or output
OLD_TOKEN = "lab-gitea-token-0b1d2e"
NS = "flux-system"
T = 15


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    if not (tools_bin / "flux-operator").exists():
        pytest.fail(f"flux-operator missing from {tools_bin}; run `make tools`")
    with running_lab(tmp_path_factory.mktemp("flux-lab"), nodes=1, first_address=NODE, hub_address=HUB) as state:
        yield state


@pytest.fixture(scope="module")
def git(tmp_path_factory):
    root = tmp_path_factory.mktemp("git")
    files = {"clusters/lab/a/kustomization.yaml": "resources: [infrastructure.yaml, apps.yaml]\n"}
    primary_root, backup_root = root / "primary", root / "backup"
    primary_root.mkdir(), backup_root.mkdir()
    shas = {"primary": init_repo(primary_root, "fleet", files),
            "backup": init_repo(backup_root, "fleet-backup", {**files, "BACKUP": "read-only copy\n"})}
    primary = GitServer(primary_root, "127.0.43.202", token=TOKEN).start()
    backup = GitServer(backup_root, "127.0.43.203").start()
    yield {"primary": primary.url("fleet"), "backup": backup.url("fleet-backup"), "shas": shas}
    primary.stop()
    backup.stop()


class Zone:
    """The zone's stack and what it is configured with."""

    def __init__(self, stack: Stack, lab: Path, chart: Path, git: dict):
        self.stack, self.lab, self.chart, self.git = stack, lab, chart, git
        self.credentials = {"primary": TOKEN, "gitea": OLD_TOKEN}

    def configure(self, **flux) -> None:
        cfg = lab_stack_config(self.lab)  # this lab runs no ACME server: the stand-in cert-manager chart
        cfg["kontinuum:defaults"]["timeouts"].update(flux=240)
        zone = {"zone": "a", "talosAddresses": [NODE]}
        if flux.get("source") is not False:
            zone["flux"] = {
                "source": {"url": self.git["primary"], "credential": "primary"},
                "fallbackSource": {"url": self.git["backup"]},
                "operatorChart": {"path": str(self.chart)},
                "credentials": {name: {"username": "git"} for name in self.credentials},
                **flux,
            }
        cfg["kontinuum:zones"] = [zone]
        self.stack.write_config_file({"config": cfg})
        if "flux" in zone:  # the tokens only ever go in encrypted (pulumi config set --secret --path)
            for name, token in self.credentials.items():
                self.stack.run("config", "set", "--stack", self.stack.name, "--secret", "--path",
                               f"kontinuum:zones[0].flux.credentials.{name}.token", stdin=token)

    def up(self) -> subprocess.CompletedProcess:
        out = self.stack.up(timeout=900)
        assert TOKEN not in out.stdout + out.stderr and OLD_TOKEN not in out.stdout + out.stderr
        return out

    def no_op(self) -> None:
        out = self.stack.run("preview", "--expect-no-changes", check=False, timeout=300)
        assert out.returncode == 0, f"a second run would change something:\n{out.stdout}\n{out.stderr}"

    def planned(self) -> list[tuple[str, str]]:
        out = json.loads(self.stack.preview("--json").stdout)
        return sorted((s["op"], s["urn"].rsplit("::", 1)[-1]) for s in out.get("steps", []) if s["op"] != "same")

    def api(self) -> client.ApiClient:
        kubeconfig = self.stack.outputs(show_secrets=True)["kubeconfigs"]["a"]
        return api_client(kubeconfig)


@pytest.fixture(scope="module")
def zone(lab, git, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flux-stack")
    chart = flux_operator.chart_dir(tmp / "flux-operator-chart")
    stack = Stack(ROOT, "flux", tmp / "state", passphrase="e2e-flux", config_file=tmp / "Pulumi.flux.yaml").init()
    return Zone(stack, lab, chart, git)


def custom(z: Zone, group: str, plural: str, name: str, namespace: str = NS) -> dict | None:
    api = z.api()
    try:
        return client.CustomObjectsApi(api).get_namespaced_custom_object(group, "v1", namespace, plural, name,
                                                                         _request_timeout=T)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    finally:
        api.close()


def instance(z):
    return custom(z, "fluxcd.controlplane.io", "fluxinstances", "flux")


def git_repository(z):
    return custom(z, "source.toolkit.fluxcd.io", "gitrepositories", NS)


def kustomization(z):
    return custom(z, "kustomize.toolkit.fluxcd.io", "kustomizations", NS)


def secrets(z) -> set[str]:
    api = z.api()
    try:
        return {s.metadata.name for s in client.CoreV1Api(api).list_namespaced_secret(NS, _request_timeout=T).items
                if s.type != "kubernetes.io/service-account-token"}
    finally:
        api.close()


def operator_pids(lab: Path) -> list[str]:
    return [k for k in json.loads((lab / "status.json").read_text())["pids"] if k.endswith("/flux-operator")]


def synced(z: Zone, url: str, sha: str) -> dict:
    """The GitRepository the operator generated, once it resolved `url` at refs/heads/main."""
    def check():
        repo = git_repository(z)
        rev = ((repo or {}).get("status") or {}).get("artifact", {}).get("revision")
        return repo if repo and repo["spec"]["url"] == url and rev == f"refs/heads/main@sha1:{sha}" else None
    return wait_until(f"the sync to resolve {url}", check, 60, interval=1)


def test_zone_with_flux_comes_up_with_the_instance_ready_and_syncing(zone, git, lab):
    zone.configure()
    zone.up()
    assert operator_pids(lab), "the FluxInstance must be the real operator's work"
    assert zone.stack.outputs()["zones"]["a"]["ready"] is True
    fi = instance(zone)
    ready = next(c for c in fi["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    assert fi["spec"]["sync"] == {"kind": "GitRepository", "url": git["primary"], "ref": "refs/heads/main",
                                  "path": "clusters/lab/a", "interval": "1m", "pullSecret": "primary"}
    repo = synced(zone, git["primary"], git["shas"]["primary"])  # the token Secret opened the primary server
    assert repo["spec"]["secretRef"] == {"name": "primary"}
    assert kustomization(zone)["spec"]["path"] == "clusters/lab/a"
    api = zone.api()
    try:
        dep = client.AppsV1Api(api).read_namespaced_deployment("flux-operator", NS, _request_timeout=T)
    finally:
        api.close()
    pod = dep.spec.template.spec
    assert pod.host_network is True
    assert {(e.name, e.value) for e in pod.containers[0].env} >= {("KUBERNETES_SERVICE_HOST", "localhost"),
                                                                  ("KUBERNETES_SERVICE_PORT", "7445")}
    assert {"primary", "gitea"} <= secrets(zone)
    exported = json.dumps(zone.stack.export())
    assert TOKEN not in exported and OLD_TOKEN not in exported
    zone.no_op()


def test_fallback_source_and_back_changes_only_the_source(zone, git):
    zone.configure(useFallbackSource=True)
    assert zone.planned() == [("update", "lab-a-flux-instance")]
    zone.up()
    assert instance(zone)["spec"]["sync"]["url"] == git["backup"]
    assert "pullSecret" not in instance(zone)["spec"]["sync"]
    synced(zone, git["backup"], git["shas"]["backup"])
    zone.no_op()

    zone.configure()
    assert zone.planned() == [("update", "lab-a-flux-instance")]
    zone.up()
    synced(zone, git["primary"], git["shas"]["primary"])
    zone.no_op()


def test_suspend_apps_then_resume(zone):
    zone.configure(suspendApps=True)
    zone.up()
    [patch] = kustomization(zone)["spec"]["patches"]
    assert patch["target"]["name"] == "^(apps)$"
    assert json.loads(patch["patch"]) == [{"op": "add", "path": "/spec/suspend", "value": True}]
    zone.no_op()

    zone.configure(suspendApps=False)
    zone.up()
    assert "patches" not in kustomization(zone)["spec"]
    zone.no_op()


def test_a_flux_instance_changed_by_hand_is_drift_the_next_up_repairs(zone):
    api = zone.api()
    try:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            "fluxcd.controlplane.io", "v1", NS, "fluxinstances", "flux", {"spec": {"sync": {"interval": "7m"}}},
            _request_timeout=T)
    finally:
        api.close()
    refreshed = zone.stack.run("refresh", "--yes", "--skip-preview", timeout=300)
    assert "FluxInstance" in refreshed.stdout + refreshed.stderr and "drift" in refreshed.stdout + refreshed.stderr
    assert zone.planned() == [("update", "lab-a-flux-instance")]
    zone.up()
    assert instance(zone)["spec"]["sync"]["interval"] == "1m"
    zone.no_op()


def test_retiring_credentials_deletes_only_theirs(zone):
    # The seed's Terraform-era key: a Secret this stack never managed.
    api = zone.api()
    try:
        client.CoreV1Api(api).create_namespaced_secret(NS, {"metadata": {"name": "flux-system-gitea"},
                                                            "stringData": {"identity": "old"}}, _request_timeout=T)
    finally:
        api.close()
    del zone.credentials["gitea"]  # a managed one leaves the config: Pulumi deletes its Secret
    zone.configure(retiredCredentials=["flux-system-gitea"])
    zone.up()
    left = secrets(zone)
    assert "gitea" not in left and "flux-system-gitea" not in left and "primary" in left
    synced(zone, zone.git["primary"], zone.git["shas"]["primary"])  # the sync still reads the primary
    # Seed 002's order: retired only once the sync had applied the current source's revision.
    [retired] = [r for r in zone.stack.export()["deployment"]["resources"] if r["type"].endswith(":RetiredCredentials")]
    assert retired["outputs"]["provenRevision"] == f"refs/heads/main@sha1:{zone.git['shas']['primary']}"
    zone.no_op()


def test_removing_flux_uninstalls_operator_and_namespace(zone, lab):
    zone.configure(source=False)
    zone.up()
    api = zone.api()
    try:
        core = client.CoreV1Api(api)
        names = {n.metadata.name for n in core.list_namespace(_request_timeout=T).items}
        assert NS not in names
        crds = client.ApiextensionsV1Api(api).list_custom_resource_definition(_request_timeout=T).items
        assert not [c.metadata.name for c in crds if c.metadata.name.endswith(".fluxcd.controlplane.io")]
    finally:
        api.close()
    wait_until("the lab to stop the real operator with its pod", lambda: not operator_pids(lab), 30)
    zone.no_op()


def test_a_handed_over_flux_keeps_running_when_the_zone_drops_it(zone, lab):
    """Seed 002's run-once mode: bootstrapped by the stack, then Git's."""
    zone.configure(handOver=True)
    out = zone.up()
    assert "flux.handOver: Git owns Flux" in out.stdout + out.stderr and f"namespace {NS}" in out.stdout + out.stderr
    zone.configure(source=False)
    zone.up()
    kept = [r["urn"] for r in zone.stack.export()["deployment"]["resources"] if "FluxHandOff" in r["urn"]]
    assert kept == [], kept  # forgotten by the stack ...
    ready = next(c for c in instance(zone)["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and operator_pids(lab)  # ... and still running
    assert "primary" in secrets(zone)
    zone.no_op()
    zone.stack.destroy(timeout=600)
