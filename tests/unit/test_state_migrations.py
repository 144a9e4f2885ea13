"""Moving per-slot ConfigApply state to per-machine names: only exact address matches move."""

from kontinuum.state_migrations import member_renames

BASE = "urn:pulumi:lab::kontinuum::kontinuum:index:Zone$"


def _instance(name, address, interfaces=None):
    return {"urn": f"{BASE}pulumi-python:dynamic:Resource::{name}",
            "outputs": {"name": name, "address": address, "interfaces": interfaces or [address], "discovered": True}}


def _slot(name, address, **extra):
    return {"urn": f"{BASE}kontinuum:index:TalosCluster$pulumi-python:dynamic:Resource::{name}",
            "outputs": {"address": address, "role": "worker", "configHash": "ab", **extra}}


def test_slots_move_to_the_machine_whose_address_they_recorded():
    deployment = {"resources": [
        _instance("lab-x-11111111", "127.0.10.11"),
        _instance("lab-x-22222222", "127.0.10.13", ["127.0.10.12", "127.0.10.13"]),  # answered on its second
        _instance("lab-xy-33333333", "127.0.10.14"),
        _slot("lab-x-controlplane-0", "127.0.10.11"),
        _slot("lab-x-web-0", "127.0.10.13"),
        _slot("lab-xy-web-0", "127.0.10.11"),  # another zone's slot: never a machine of zone x
        _slot("lab-x-web-1", "127.0.10.99"),
        _slot("lab-x-22222222", "127.0.10.13", instance="lab-x-22222222"),  # moved already
        {"urn": "urn:pulumi:lab::kontinuum::pulumi:pulumi:Stack::kontinuum-lab", "outputs": {}},
    ]}
    renames, unmatched = member_renames(deployment)
    assert [(r.urn.rsplit("::", 1)[1], r.new_name) for r in renames] == [("lab-x-controlplane-0", "lab-x-11111111")]
    assert unmatched == [
        "lab-x-web-0 (address 127.0.10.13): lab-x-22222222 exists already",
        "lab-xy-web-0 (address 127.0.10.11): no Instance of the zone has that address",
        "lab-x-web-1 (address 127.0.10.99): no Instance of the zone has that address",
    ]


def test_a_moved_stack_has_nothing_to_move():
    deployment = {"resources": [_instance("lab-x-11111111", "127.0.10.11"),
                                _slot("lab-x-11111111", "127.0.10.11", instance="lab-x-11111111")]}
    assert member_renames(deployment) == ([], [])


def test_recover_moves_an_old_stack_with_the_engine_only_for_the_move(tmp_path, monkeypatch):
    """tools/pulumi's `recover` reads the stack from a file backend's checkpoint; the engine runs
    only for the rename (and not at all once the stack is moved)."""
    import argparse
    import json

    from kontinuum import recover
    from kontinuum.cli import recover as recover_cli

    old = {"resources": [_instance("lab-x-11111111", "127.0.10.11"), _slot("lab-x-controlplane-0", "127.0.10.11")]}
    state = tmp_path / "state" / ".pulumi"
    (state / "stacks" / "kontinuum").mkdir(parents=True)
    (state / "meta.yaml").write_text("version: 1\n")
    checkpoint = state / "stacks" / "kontinuum" / "lab.json"
    checkpoint.write_text(json.dumps({"version": 3, "checkpoint": {"latest": old}}))
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: kontinuum\nruntime: python\n")
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path / 'state'}")
    calls = []

    def engine(*args, cwd, input_file=None):
        calls.append(args)
        return __import__("subprocess").CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(recover, "engine", engine)
    args = argparse.Namespace(stack="lab", cwd=project)
    assert recover_cli.run(args) == 0
    assert calls == [("state", "rename", "--yes", "--stack", "lab",
                      old["resources"][1]["urn"], "lab-x-11111111")]

    calls.clear()
    moved = {"resources": [_instance("lab-x-11111111", "127.0.10.11"),
                           _slot("lab-x-11111111", "127.0.10.11", instance="lab-x-11111111")]}
    checkpoint.write_text(json.dumps({"version": 3, "checkpoint": {"latest": moved}}))
    assert recover_cli.run(args) == 0
    assert calls == []
