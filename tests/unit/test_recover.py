"""Recovery decisions (kontinuum.recover, kontinuum.kube.helm_records), pure: which pending
operations are dropped, which Helm records are cleared, which locks are stale."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys

import pytest

from kontinuum import file_backend, recover
from kontinuum.kube.helm_records import Record, records_to_clear

STACK = "urn:pulumi:lab::kontinuum::"


def op(kind: str, rtype: str, name: str, parent: str = "kontinuum:index:Zone$") -> dict:
    urn = f"{STACK}{parent}{rtype}::{name}"
    return {"type": kind, "resource": {"urn": urn, "type": rtype, "custom": True, "inputs": {"name": name}}}


def test_pending_creates_of_our_types_are_dropped_and_helm_ops_get_their_records_cleared():
    ops = [op("creating", "pulumi-python:dynamic:Resource", "lab-a-join"),
           op("creating", "kubernetes:core/v1:Namespace", "lab-a-ns"),
           op("creating", "kubernetes:helm.sh/v3:Release", "lab-a-cilium"),
           op("updating", "kubernetes:helm.sh/v3:Release", "lab-b-cilium"),
           op("deleting", "pulumi-python:dynamic:Resource", "lab-b-guard"),
           op("creating", "pulumi:providers:kubernetes", "lab-a-provider", parent=""),
           {**op("creating", "kontinuum:index:Zone", "lab-a", parent=""), "resource": {
               "urn": f"{STACK}kontinuum:index:Zone::lab-a", "type": "kontinuum:index:Zone", "custom": False}}]
    p = recover.plan({"pending_operations": ops})
    assert [o["resource"]["urn"].rsplit("::", 1)[1] for o in p.drop] == ["lab-a-join", "lab-a-ns", "lab-a-cilium",
                                                                          "lab-a-provider", "lab-a"]
    assert [(o["type"], o["resource"]["inputs"]["name"]) for o in p.helm] == [("creating", "lab-a-cilium"),
                                                                            ("updating", "lab-b-cilium")]
    assert p.unknown == []  # the pending delete is left to the engine: it deletes again


def test_a_pending_create_of_a_foreign_type_is_not_dropped():
    p = recover.plan({"pending_operations": [op("creating", "aws:s3/bucket:Bucket", "b")]})
    assert p.drop == [] and len(p.unknown) == 1


def test_without_removes_only_the_given_operations():
    a, b = op("creating", "pulumi-python:dynamic:Resource", "a"), op("creating", "kubernetes:core/v1:Secret", "b")
    d = recover.without({"resources": [1], "pending_operations": [a, b]}, [a])
    assert d == {"resources": [1], "pending_operations": [b]}


def test_resource_type_of_a_nested_urn():
    assert recover.resource_type(f"{STACK}kontinuum:index:Zone$kubernetes:helm.sh/v3:Release::x") == \
        "kubernetes:helm.sh/v3:Release"


def test_helm_records_left_by_a_killed_install_are_cleared_whatever_the_install_reached():
    for status in ("pending-install", "deployed", "failed"):
        chosen, refusal = records_to_clear([Record("sh.helm.release.v1.cilium.v1", 1, status)], "creating")
        assert [r.name for r in chosen] == ["sh.helm.release.v1.cilium.v1"] and refusal is None


def test_a_release_with_older_history_is_never_cleared_for_a_pending_create():
    records = [Record("r.v1", 1, "superseded"), Record("r.v2", 2, "deployed")]
    chosen, refusal = records_to_clear(records, "creating")
    assert chosen == [] and "v1 superseded, v2 deployed" in refusal


def test_a_killed_upgrade_clears_only_its_pending_revision():
    records = [Record("r.v1", 1, "deployed"), Record("r.v2", 2, "pending-upgrade")]
    assert records_to_clear(records, "updating") == ([Record("r.v2", 2, "pending-upgrade")], None)
    assert records_to_clear(records[:1], "updating") == ([], None)
    assert records_to_clear([], "creating") == ([], None)


def test_a_lock_is_stale_only_on_this_host_with_its_engine_gone():
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert file_backend.stale({"hostname": host, "pid": dead.pid}, host)
    assert not file_backend.stale({"hostname": "another-runner", "pid": dead.pid}, host)
    # alive, but not an engine (a reused pid): stale; the test process itself is python
    assert file_backend.stale({"hostname": host, "pid": os.getpid()}, host)


def test_secret_values_from_an_export_with_secrets_shown():
    sig = "4dabf18193072939515e22adb298388d"
    assert recover.secret_value({sig: "1b47061264138c4ac30d75fd1eb44270", "plaintext": '"apiVersion: v1"'}) == \
        "apiVersion: v1"
    assert recover.secret_value("plain") == "plain"


def test_release_target_reads_name_namespace_and_the_providers_kubeconfig():
    provider = f"{STACK}pulumi:providers:kubernetes::lab-a-k8s"
    release = op("creating", "kubernetes:helm.sh/v3:Release", "lab-a-cilium")
    release["resource"]["inputs"] = {"name": "cilium", "namespace": "kube-system"}
    release["resource"]["provider"] = f"{provider}::0b1c"
    deployment = {"resources": [{"urn": provider, "inputs": {"kubeconfig": {"plaintext": '"kc"'}}}]}
    assert recover.release_target(release, deployment) == ("kube-system", "cilium", "kc")


def test_checkpoint_sidecars_left_half_written_are_rewritten(tmp_path):
    stacks = tmp_path / ".pulumi" / "stacks" / "kontinuum"
    stacks.mkdir(parents=True)
    (stacks / "lab.json").write_text('{"version": 3}')
    (stacks / "lab.json.attrs").write_text("")  # the kill landed between the rename and the sidecar
    (stacks / "lab.json.bak").write_text('{"version": 2}')
    good = {"user.content_type": "text/plain; charset=utf-8", "md5": file_backend.md5(b'{"version": 2}')}
    (stacks / "lab.json.bak.attrs").write_text(json.dumps(good))
    (stacks / "lab.json.1234.tmp").write_text("{")
    fixed = file_backend.repair_attributes(f"file://{tmp_path}", "kontinuum", "lab")
    assert fixed == [stacks / "lab.json.attrs"]
    attrs = json.loads((stacks / "lab.json.attrs").read_text())
    assert attrs["md5"] == file_backend.md5(b'{"version": 3}') and attrs["user.content_type"].startswith("text/plain")
    assert json.loads((stacks / "lab.json.bak.attrs").read_text()) == good
    assert file_backend.repair_attributes(f"file://{tmp_path}", "kontinuum", "lab") == []
    assert file_backend.repair_attributes("s3://bucket", "kontinuum", "lab") == []


# -- deciding without the engine (file backend) ----------------------------------------------------


class Engine:
    """A stand-in for `tools/pulumi` that records each command and answers `stack export`."""

    def __init__(self, exported: dict | None = None):
        self.calls: list[list[str]] = []
        self.exported = exported
        self.imported = None

    def __call__(self, *args: str, cwd, input_file=None) -> subprocess.CompletedProcess:
        self.calls.append(list(args))
        if args[:2] == ("stack", "export"):
            return subprocess.CompletedProcess(args, 0, json.dumps(self.exported), "")
        if args[:2] == ("stack", "import"):
            self.imported = json.loads(open(args[args.index("--file") + 1]).read())
        if args[:2] == ("stack", "--show-name"):
            return subprocess.CompletedProcess(args, 0, "from-engine\n", "")
        return subprocess.CompletedProcess(args, 0, "", "")

    def commands(self) -> list[str]:
        return [" ".join(c[:2]) for c in self.calls]


def backend(tmp_path, monkeypatch, deployment: dict | None, *, stack="lab", meta="version: 1\n"):
    """A file backend holding `stack` of project kontinuum (no checkpoint when deployment is None),
    and a project folder; returns the project folder."""
    root = tmp_path / "state" / ".pulumi"
    (root / "stacks" / "kontinuum").mkdir(parents=True)
    if meta is not None:
        (root / "meta.yaml").write_text(meta)
    if deployment is not None:
        checkpoint = {"version": 3, "checkpoint": {"stack": f"organization/kontinuum/{stack}", "latest": deployment}}
        (root / "stacks" / "kontinuum" / f"{stack}.json").write_text(json.dumps(checkpoint))
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: kontinuum\nruntime: python\n")
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path / 'state'}")
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PULUMI_STACK", raising=False)
    return project


CLEAN = {"manifest": {"time": "2026-12-02T00:00:00Z"}, "resources": [{"urn": f"{STACK}pulumi:pulumi:Stack::k-lab"}]}


def test_the_checkpoint_reads_as_the_engines_export(tmp_path, monkeypatch):
    backend(tmp_path, monkeypatch, CLEAN)
    url = f"file://{tmp_path / 'state'}"
    assert file_backend.checkpoint(url, "kontinuum", "lab") == {"version": 3, "deployment": CLEAN}
    assert file_backend.checkpoint(url, "kontinuum", "other") is None  # no such stack
    stacks = tmp_path / "state" / ".pulumi" / "stacks" / "kontinuum"
    (stacks / "lab.json.gz").write_bytes(b"")  # the engine would pick the newer of the two
    with pytest.raises(file_backend.NotReadable):
        file_backend.checkpoint(url, "kontinuum", "lab")
    with pytest.raises(file_backend.NotReadable):
        file_backend.checkpoint("s3://bucket", "kontinuum", "lab")


@pytest.mark.parametrize("meta", [None, "version: 0\n"])
def test_only_the_project_layout_is_read_without_the_engine(tmp_path, monkeypatch, meta):
    backend(tmp_path, monkeypatch, CLEAN, meta=meta)
    with pytest.raises(file_backend.NotReadable):
        file_backend.checkpoint(f"file://{tmp_path / 'state'}", "kontinuum", "lab")


@pytest.mark.parametrize("stack", ["lab", "organization/kontinuum/lab"])
def test_nothing_to_settle_starts_no_engine(tmp_path, monkeypatch, stack):
    project = backend(tmp_path, monkeypatch, CLEAN)
    engine = Engine()
    monkeypatch.setattr(recover, "engine", engine)
    assert recover.recover(stack, project, log=lambda m: None) == {"version": 3, "deployment": CLEAN}
    assert engine.calls == []


def test_a_stack_without_state_starts_no_engine(tmp_path, monkeypatch):
    project = backend(tmp_path, monkeypatch, None)
    engine = Engine()
    monkeypatch.setattr(recover, "engine", engine)
    assert recover.recover("lab", project, log=lambda m: None) is None
    assert engine.calls == []


def test_a_pending_create_is_settled_on_the_engines_own_export(tmp_path, monkeypatch):
    pending = op("creating", "pulumi-python:dynamic:Resource", "lab-a-join")
    deployment = {**CLEAN, "pending_operations": [pending]}
    project = backend(tmp_path, monkeypatch, deployment)
    engine = Engine({"version": 3, "deployment": deployment})
    monkeypatch.setattr(recover, "engine", engine)
    recover.recover("lab", project, log=lambda m: None)
    assert engine.commands() == ["stack export", "stack import"]
    assert engine.imported["deployment"]["pending_operations"] == []


def test_another_backend_asks_the_engine(tmp_path, monkeypatch):
    project = backend(tmp_path, monkeypatch, CLEAN)
    monkeypatch.setenv("PULUMI_BACKEND_URL", "s3://bucket/state")
    engine = Engine({"version": 3, "deployment": CLEAN})
    monkeypatch.setattr(recover, "engine", engine)
    assert recover.recover("lab", project, log=lambda m: None)["deployment"] == CLEAN
    assert engine.commands() == ["stack export"]


def workspace(tmp_path, project, settings: dict) -> None:
    digest = hashlib.sha1(str((project / "Pulumi.yaml").resolve()).encode()).hexdigest()
    path = tmp_path / "home" / "workspaces" / f"kontinuum-{digest}-workspace.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(settings))


def test_the_selected_stack_is_read_from_the_workspace_for_this_backend(tmp_path, monkeypatch):
    project = backend(tmp_path, monkeypatch, CLEAN)
    engine = Engine()
    monkeypatch.setattr(recover, "engine", engine)
    workspace(tmp_path, project, {"stacks": {f"file://{tmp_path / 'state'}": "lab", "s3://elsewhere": "eu"}})
    assert recover.recover(None, project, log=lambda m: None) == {"version": 3, "deployment": CLEAN}
    assert engine.calls == []
    monkeypatch.setenv("PULUMI_STACK", "eu")  # the engine's override
    assert recover.selected_stack(project) == "eu"


def test_without_a_selection_for_this_backend_the_engine_says_which_stack(tmp_path, monkeypatch):
    project = backend(tmp_path, monkeypatch, CLEAN)
    engine = Engine()
    monkeypatch.setattr(recover, "engine", engine)
    workspace(tmp_path, project, {"stack": "legacy", "stacks": {"s3://elsewhere": "eu"}})
    assert recover.selected_stack(project) == "from-engine"
    assert engine.commands() == ["stack --show-name"]


def test_the_recover_command_imports_no_other_command():
    """tools/pulumi starts `python -m kontinuum recover` before every up: it loads only its own code."""
    script = ("import sys\nfrom kontinuum.__main__ import main\ntry:\n    main(['recover', '--help'])\n"
              "except SystemExit:\n    pass\nprint(sorted(m for m in sys.modules if m.startswith('kontinuum.cli.')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip().splitlines()[-1] == "['kontinuum.cli.recover']", out.stderr
