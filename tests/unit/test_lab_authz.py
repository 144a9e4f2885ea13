"""The emulated node's role table is Talos's (lab/talos_node/authz.py): every method the lab
serves takes its roles from it, and where the Talos v1.13.0 module is in the Go module cache,
the table is compared with machined's own `rules` line by line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab.talos_node import authz, rpc

TALOS = Path("/root/go/pkg/mod/github.com/siderolabs/talos@v1.13.0/internal/app/machined/pkg/system/services/machined.go")
GO_ROLES = {"Admin": authz.ADMIN, "Operator": authz.OPERATOR, "Reader": authz.READER, "EtcdBackup": authz.ETCD_BACKUP,
            "ImageVerifier": authz.IMAGE_VERIFIER, "MetaWriter": authz.META_WRITER}


def test_the_backup_role_may_only_snapshot_and_read_etcd():
    assert sorted(p for p, roles in authz.RULES.items() if authz.ETCD_BACKUP in roles) == [
        "/machine.MachineService/EtcdAlarmList", "/machine.MachineService/EtcdMemberList",
        "/machine.MachineService/EtcdSnapshot", "/machine.MachineService/EtcdStatus"]
    assert authz.allowed("/machine.MachineService/SomethingNew") == {authz.ADMIN}  # machined's fallback


def test_every_served_method_takes_its_roles_from_talos_table():
    for method in rpc.METHODS:
        assert method.path in authz.RULES, method.path
        assert method.roles == authz.RULES[method.path]


@pytest.mark.skipif(not TALOS.exists(), reason="the Talos v1.13.0 module is not in the Go module cache")
def test_the_table_is_machineds_own():
    text = TALOS.read_text()
    body = re.sub(r"//[^\n]*", "", text[text.index("var rules = map[string]role.Set{"):].split("\n}\n")[0])
    theirs = {m.group(1): frozenset(GO_ROLES[r.strip().split(".")[1]] for r in m.group(2).split(",") if r.strip())
              for m in re.finditer(r'"(/[^"]+)":\s*role\.MakeSet\(([^)]*)\)', body, re.S)}
    assert theirs == authz.RULES
