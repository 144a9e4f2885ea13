"""Recovery decisions (kontinuum.recover, kontinuum.kube.helm_records), pure: which pending
operations are dropped, which Helm records are cleared, which locks are stale."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

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
