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
