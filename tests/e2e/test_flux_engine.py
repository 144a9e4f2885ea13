"""The GitOps hand-off (issues 19 and 29, seed 002) through `pulumi up` on the lab: a zone with
`flux` comes up with the REAL Flux Operator reconciling FluxInstance `flux` and Flux's own
source- and kustomize-controller (lab/flux_controllers.py) fetching from real Git servers on
loopback and applying real objects: the primary over SSH with a deploy key (the seed's case),
the read-only backup over HTTP. Switching to the fallback source and back, suspending the apps
(a Kustomization declared one level below the sync path) while the infrastructure reconciles a
new commit and resuming them, a FluxInstance changed by hand (drift, repaired), retiring a
credential (after the sync proved the current source), an operator off KubePrism (bounded,
named), removing `flux` (uninstalled) and, bootstrapped again with `handOver`, dropping it (Flux
keeps running and applying from Git) each change exactly that, and a second run after each step
plans nothing.

One lab for the module: node 127.0.43.21 (its KubePrism on 127.0.43.21:7445), hub 127.0.0.43,
Git servers 127.0.43.204 (SSH, the primary) and 127.0.43.203 (HTTP, the read-only backup); the
Gitea-era credential is a token no server is asked with. Tests run in file order.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client

from kontinuum.kube.clients import api_client
from lab import flux_operator
from lab.git_server import GitServer, init_repo
from lab.git_ssh_server import GitSshServer
from lab.process import wait_until
from lab.pulumi_cli import ROOT, Stack
from tests.e2e.labs import lab_stack_config, running_lab

NODE, HUB = "127.0.43.21", "127.0.0.43"
OLD_TOKEN = "lab-gitea-token-0b1d2e"  # the Gitea-era credential: never in state or output
NS = "flux-system"
T = 15


@pytest.fixture(scope="module")
def lab(tools_bin, tmp_path_factory):
    if not (tools_bin / "flux-operator").exists():
        pytest.fail(f"flux-operator missing from {tools_bin}; run `make tools`")
    with running_lab(tmp_path_factory.mktemp("flux-lab"), nodes=1, first_address=NODE, hub_address=HUB) as state:
        yield state


# A Flux repository as `flux bootstrap` lays it out: the sync path holds the infrastructure
# Kustomization and, one level below, the apps one; each applies a directory of plain objects.
def fleet_files(tag: str) -> dict[str, str]:
    ks = ("apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {{name: {name}, namespace: {ns}}}\n"
          "spec:\n  interval: 1m\n  path: ./{name}\n  prune: true\n  sourceRef: {{kind: GitRepository, name: {ns}}}\n{extra}")
    cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: lab}}\ndata: {{tag: {tag}}}\n"
    return {"clusters/lab/a/infrastructure.yaml": ks.format(name="infrastructure", ns=NS, extra=""),
            "clusters/lab/a/apps/apps.yaml": ks.format(name="apps", ns=NS,
                                                       extra="  dependsOn: [{name: infrastructure}]\n"),
            "infrastructure/namespace.yaml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: lab}\n",
            "infrastructure/infra.yaml": cm.format(name="infra", tag=tag),
            "apps/app.yaml": cm.format(name="app", tag=tag)}


@pytest.fixture(scope="module")
def git(tmp_path_factory):
    root = tmp_path_factory.mktemp("git")
    roots = {k: root / k for k in ("primary", "backup")}
    for r in roots.values():
        r.mkdir()
    shas = {"primary": init_repo(roots["primary"], "fleet", fleet_files("primary")),
            "backup": init_repo(roots["backup"], "fleet-backup", {**fleet_files("backup"), "BACKUP": "read-only\n"})}
    primary = GitSshServer(roots["primary"], "127.0.43.204", workdir=root / "sshd").start()
    deploy_key = primary.deploy_key("fleet")
    backup = GitServer(roots["backup"], "127.0.43.203").start()
    yield {"primary": primary.url("fleet"), "backup": backup.url("fleet-backup"), "shas": shas,
           "deploy_key": deploy_key, "known_hosts": primary.known_hosts(), "primary_root": roots["primary"]}
    primary.stop()
    backup.stop()


def leaked(text: str, git: dict) -> bool:
    key_body = git["deploy_key"].splitlines()[1]  # a line of the private key's base64
    return OLD_TOKEN in text or key_body in text


class Zone:
    """The zone's stack and what it is configured with."""

    def __init__(self, stack: Stack, lab: Path, chart: Path, git: dict):
        self.stack, self.lab, self.chart, self.git = stack, lab, chart, git
        self.credentials = {"primary": {"knownHosts": git["known_hosts"]}, "gitea": {"username": "git"}}
        self.secrets = {"primary": ("sshPrivateKey", git["deploy_key"]), "gitea": ("token", OLD_TOKEN)}

    def configure(self, *, flux_timeout: int = 240, chart: Path | None = None, **flux) -> None:
        cfg = lab_stack_config(self.lab)  # this lab runs no ACME server: the stand-in cert-manager chart
        cfg["kontinuum:defaults"]["timeouts"].update(flux=flux_timeout)
        zone = {"zone": "a", "talosAddresses": [NODE]}
        if flux.get("source") is not False:
            zone["flux"] = {
                "source": {"url": self.git["primary"], "credential": "primary"},
                "fallbackSource": {"url": self.git["backup"]},
                "operatorChart": {"path": str(chart or self.chart)},
                "credentials": dict(self.credentials),
                **flux,
            }
        cfg["kontinuum:zones"] = [zone]
        self.stack.write_config_file({"config": cfg})
        if "flux" in zone:  # the key and token only ever go in encrypted (pulumi config set --secret --path)
            for name in self.credentials:
                key, value = self.secrets[name]
                self.stack.run("config", "set", "--stack", self.stack.name, "--secret", "--path",
                               f"kontinuum:zones[0].flux.credentials.{name}.{key}", stdin=value)

    def up(self) -> subprocess.CompletedProcess:
        out = self.stack.up(timeout=900)
        assert not leaked(out.stdout + out.stderr, self.git)
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


FLUX_PROCESSES = ("flux-operator", "source-controller", "kustomize-controller", "notification-controller")


def flux_pids(lab: Path) -> list[str]:
    """The Flux processes the lab runs now, by name."""
    names = [k.rpartition("/")[2] for k in json.loads((lab / "status.json").read_text())["pids"]]
    return [n for n in names if n in FLUX_PROCESSES]


def operator_log(lab: Path) -> str:
    """The operator process's own log, its current run."""
    (path,) = lab.glob("clusters/*/pods/flux-operator/flux-operator.log")
    return path.read_text(errors="replace")


def operator_log_route(lab: Path) -> str:
    """The lab's log lines saying where the operator's API address led."""
    text = (lab / "logs" / "supervisor.log").read_text(errors="replace")
    return "\n".join(line for line in text.splitlines() if "flux-operator running for pod" in line)


def synced(z: Zone, url: str, sha: str) -> dict:
    """The GitRepository the operator generated, once source-controller fetched `url` at main."""
    def check():
        repo = git_repository(z)
        rev = (((repo or {}).get("status") or {}).get("artifact") or {}).get("revision")
        return repo if repo and repo["spec"]["url"] == url and rev == f"refs/heads/main@sha1:{sha}" else None
    return wait_until(f"source-controller to fetch {url}", check, 90, interval=1)


def applied(z: Zone, name: str, sha: str) -> dict:
    """Kustomization `name` once kustomize-controller applied the commit `sha`."""
    def check():
        ks = custom(z, "kustomize.toolkit.fluxcd.io", "kustomizations", name)
        status = (ks or {}).get("status") or {}
        return ks if status.get("lastAppliedRevision", "").endswith(f"sha1:{sha}") else None
    return wait_until(f"kustomize-controller to apply {name} at {sha[:8]}", check, 120, interval=1)


def config_map(z: Zone, name: str) -> dict | None:
    api = z.api()
    try:
        return client.CoreV1Api(api).read_namespaced_config_map(name, "lab", _request_timeout=T).data
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    finally:
        api.close()


def fetch_now(z: Zone) -> None:
    """Ask source-controller to fetch now rather than at its next interval (`flux reconcile source`)."""
    api = z.api()
    try:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            "source.toolkit.fluxcd.io", "v1", NS, "gitrepositories", NS,
            {"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": str(time.time())}}}, _request_timeout=T)
    finally:
        api.close()


def test_zone_bootstraps_from_ssh_source_with_a_deploy_key(zone, git, lab):
    zone.configure()
    zone.up()
    assert set(FLUX_PROCESSES) <= set(flux_pids(lab)), \
        "the FluxInstance and the sync must be the real operator's and controllers' work"
    # The operator's events reach the real notification-controller: none was refused or retried
    # (each refused one held its reconcile, and so the FluxInstance's Ready, about 15 s).
    assert "unable to record event" not in operator_log(lab)
    assert zone.stack.outputs()["zones"]["a"]["ready"] is True
    fi = instance(zone)
    ready = next(c for c in fi["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    assert fi["spec"]["sync"] == {"kind": "GitRepository", "url": git["primary"], "ref": "refs/heads/main",
                                  "path": "clusters/lab/a", "interval": "1m", "pullSecret": "primary"}
    repo = synced(zone, git["primary"], git["shas"]["primary"])  # the deploy key opened the SSH server
    assert repo["spec"]["secretRef"] == {"name": "primary"}
    assert kustomization(zone)["spec"]["path"] == "clusters/lab/a"
    applied(zone, "apps", git["shas"]["primary"])  # declared one level below the sync path
    assert config_map(zone, "infra") == {"tag": "primary"} and config_map(zone, "app") == {"tag": "primary"}
    api = zone.api()
    try:
        dep = client.AppsV1Api(api).read_namespaced_deployment("flux-operator", NS, _request_timeout=T)
    finally:
        api.close()
    pod = dep.spec.template.spec
    assert pod.host_network is True
    assert {(e.name, e.value) for e in pod.containers[0].env} >= {("KUBERNETES_SERVICE_HOST", "localhost"),
                                                                  ("KUBERNETES_SERVICE_PORT", "7445")}
    assert "127.0.43.21:7445 (the machine's own" in operator_log_route(lab)  # it dialled KubePrism
    assert {"primary", "gitea"} <= secrets(zone)
    assert not leaked(json.dumps(zone.stack.export()), git)
    zone.no_op()


def test_fallback_source_and_back_changes_only_the_source(zone, git):
    zone.configure(useFallbackSource=True)
    assert zone.planned() == [("update", "lab-a-flux-instance")]
    zone.up()
    assert instance(zone)["spec"]["sync"]["url"] == git["backup"]
    assert "pullSecret" not in instance(zone)["spec"]["sync"]
    synced(zone, git["backup"], git["shas"]["backup"])
    applied(zone, "infrastructure", git["shas"]["backup"])
    wait_until("the backup's objects applied", lambda: config_map(zone, "app") == {"tag": "backup"}, 120)
    zone.no_op()

    zone.configure()
    assert zone.planned() == [("update", "lab-a-flux-instance")]
    zone.up()
    synced(zone, git["primary"], git["shas"]["primary"])
    applied(zone, "apps", git["shas"]["primary"])
    zone.no_op()


def test_suspended_apps_wait_while_infrastructure_reconciles_then_resume(zone, git):
    zone.configure(suspendApps=True)
    zone.up()
    [patch] = kustomization(zone)["spec"]["patches"]
    assert patch["target"]["name"] == "^(apps)$"
    wait_until("the apps Kustomization to be suspended by the sync",
               lambda: custom(zone, "kustomize.toolkit.fluxcd.io", "kustomizations", "apps")["spec"].get("suspend"), 120)
    zone.no_op()
    # A new commit: the infrastructure follows it, the suspended apps do not.
    sha = init_repo(git["primary_root"], "fleet", fleet_files("second"))
    fetch_now(zone)
    applied(zone, "infrastructure", sha)
    assert config_map(zone, "infra") == {"tag": "second"}
    assert config_map(zone, "app") == {"tag": "primary"}, "a suspended apps Kustomization must apply nothing"
    assert custom(zone, "kustomize.toolkit.fluxcd.io", "kustomizations", "apps")["spec"]["suspend"] is True

    zone.configure(suspendApps=False)
    zone.up()
    assert "patches" not in kustomization(zone)["spec"]
    applied(zone, "apps", sha)
    assert config_map(zone, "app") == {"tag": "second"}
    git["shas"]["primary"] = sha
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


def test_operator_off_kubeprism_fails_bounded_naming_its_address(zone, tmp_path):
    # A chart that gives the operator another API address than the KubePrism override it is
    # handed (localhost:7446: nothing listens there on the node). Its real process cannot connect
    # and exits; the pod crash-loops as a kubelet reports it, and `pulumi up` stops within
    # timeouts.flux naming the pod and the address. The right chart again recovers.
    bad = tmp_path / "flux-operator-chart"
    shutil.copytree(zone.chart, bad)
    tpl = bad / "templates" / "deployment.yaml"
    tpl.write_text(tpl.read_text().replace("{{- with .Values.extraEnvs }}", (
        "- {name: KUBERNETES_SERVICE_HOST, value: localhost}\n"
        "            - {name: KUBERNETES_SERVICE_PORT, value: \"7446\"}\n"
        "            {{- with .Values.notTheOverride }}")))
    zone.configure(chart=bad, suspendApps=True, flux_timeout=45)  # the FluxInstance changes: Pulumi waits for it
    t0 = time.monotonic()
    out = zone.stack.run("up", "--yes", "--skip-preview", timeout=600, check=False)
    took = time.monotonic() - t0
    text = out.stdout + out.stderr
    assert out.returncode != 0 and not leaked(text, zone.git)
    assert "FluxInstance flux-system/flux not Ready after 45 s" in text, text[-3000:]
    assert "its API address is localhost:7446" in text and "Error (exit code 1)" in text, text[-3000:]
    assert took < 400, f"the failing up took {took:.0f} s"

    zone.configure(suspendApps=False)
    zone.up()
    assert next(c for c in instance(zone)["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
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
    wait_until("the lab to stop the real operator and controllers with their pods", lambda: not flux_pids(lab), 60)
    zone.no_op()


def test_a_handed_over_flux_keeps_running_when_the_zone_drops_it(zone, lab):
    """Seed 002's run-once mode: bootstrapped by the stack, then Git's: the real controllers go on
    applying from Git after the stack let go."""
    zone.configure(handOver=True)
    out = zone.up()
    assert "flux.handOver: Git owns Flux" in out.stdout + out.stderr and f"namespace {NS}" in out.stdout + out.stderr
    zone.configure(source=False)
    zone.up()
    kept = [r["urn"] for r in zone.stack.export()["deployment"]["resources"] if "FluxHandOff" in r["urn"]]
    assert kept == [], kept  # forgotten by the stack ...
    ready = next(c for c in instance(zone)["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and {"flux-operator", "source-controller", "kustomize-controller"} <= set(
        flux_pids(lab))  # ... and still running
    assert "primary" in secrets(zone)
    sha = init_repo(zone.git["primary_root"], "fleet", fleet_files("after-hand-over"))
    fetch_now(zone)
    applied(zone, "apps", sha)  # Git, not the stack, now drives the zone
    assert config_map(zone, "app") == {"tag": "after-hand-over"}
    zone.no_op()
    zone.stack.destroy(timeout=600)
