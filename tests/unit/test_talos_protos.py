"""Our Talos proto subset: stubs build from a fresh checkout, and the wire facts hold.

The field numbers below are Talos's (shared/reference/talos-api-facts.md); a renumbered field
would still compile and round-trip between our own client and emulator, so only a check like
this (and the Go conformance test) catches it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from protos.gen.cluster import cluster_grpc, cluster_pb2
from protos.gen.common import common_pb2
from protos.gen.machine import image_grpc, image_pb2, lifecycle_grpc, lifecycle_pb2, machine_grpc, machine_pb2
from protos.gen.v1alpha1 import meta_pb2, resource_pb2, state_grpc, state_pb2

PROTOS = Path(__file__).resolve().parents[2] / "protos"


def test_stubs_generate_on_first_import_of_a_fresh_checkout(tmp_path: Path) -> None:
    shutil.copytree(PROTOS, tmp_path / "protos", ignore=shutil.ignore_patterns("gen", "__pycache__"))
    probe = "import protos; from protos.gen.machine import machine_grpc; print(machine_grpc.MachineServiceStub.__name__)"

    def run() -> str:
        out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert run() == "MachineServiceStub"
    stamp = tmp_path / "protos" / "gen" / ".stamp"
    built = stamp.stat().st_mtime_ns
    assert run() == "MachineServiceStub"
    assert stamp.stat().st_mtime_ns == built, "stubs were regenerated although nothing changed"


def _number(message, field: str) -> int:
    return message.DESCRIPTOR.fields_by_name[field].number


@pytest.mark.parametrize(
    ("message", "field", "number"),
    [
        (common_pb2.Metadata, "hostname", 1),
        (common_pb2.Metadata, "error", 2),
        (common_pb2.Metadata, "status", 3),
        (common_pb2.Data, "bytes", 2),
        (machine_pb2.ApplyConfigurationRequest, "data", 1),
        (machine_pb2.ApplyConfigurationRequest, "mode", 4),
        (machine_pb2.ApplyConfigurationRequest, "dry_run", 5),
        (machine_pb2.ApplyConfigurationRequest, "try_mode_timeout", 6),
        (machine_pb2.ApplyConfiguration, "mode_details", 4),
        (machine_pb2.BootstrapRequest, "recover_skip_hash_check", 2),
        (machine_pb2.ResetRequest, "mode", 5),
        (machine_pb2.Reset, "actor_id", 2),
        (machine_pb2.UpgradeRequest, "reboot_mode", 5),
        (machine_pb2.Upgrade, "actor_id", 3),
        (machine_pb2.ReadRequest, "path", 1),
        (machine_pb2.RebootRequest, "mode", 1),
        (machine_pb2.Reboot, "actor_id", 2),
        (common_pb2.ContainerdInstance, "namespace", 2),
        (lifecycle_pb2.LifecycleServiceUpgradeRequest, "containerd", 1),
        (lifecycle_pb2.LifecycleServiceUpgradeRequest, "source", 2),
        (lifecycle_pb2.InstallArtifactsSource, "image_name", 1),
        (lifecycle_pb2.LifecycleServiceUpgradeResponse, "progress", 1),
        (lifecycle_pb2.LifecycleServiceInstallProgress, "message", 1),
        (lifecycle_pb2.LifecycleServiceInstallProgress, "exit_code", 2),
        (image_pb2.ImageServicePullRequest, "image_ref", 3),
        (image_pb2.ImageServicePullResponse, "name", 1),
        # the legacy MachineService.ImagePull upgrade-k8s pre-pulls with (machinery v1.13.0 machine.pb.go)
        (machine_pb2.ImagePullRequest, "namespace", 1),
        (machine_pb2.ImagePullRequest, "reference", 2),
        (machine_pb2.ImagePullResponse, "messages", 1),
        (machine_pb2.ImagePull, "metadata", 1),
        (machine_pb2.EtcdMember, "id", 2),
        (machine_pb2.EtcdMember, "is_learner", 6),
        (machine_pb2.EtcdMembers, "members", 3),
        (machine_pb2.EtcdRemoveMemberByIDRequest, "member_id", 1),
        (machine_pb2.ServiceInfo, "health", 4),
        (machine_pb2.ServiceHealth, "last_change", 4),
        (machine_pb2.Version, "features", 4),
        (machine_pb2.VersionInfo, "arch", 6),
        (cluster_pb2.HealthCheckRequest, "cluster_info", 2),
        (cluster_pb2.ClusterInfo, "force_endpoint", 3),
        (cluster_pb2.HealthCheckProgress, "message", 2),
        (resource_pb2.Metadata, "labels", 10),
        (resource_pb2.Metadata, "annotations", 11),
        (resource_pb2.Spec, "yaml_spec", 2),
        (state_pb2.GetRequest, "options", 4),
        (state_pb2.ListOptions, "id_query", 2),
        (meta_pb2.ResourceDefinitionSpec, "sensitivity", 7),
    ],
)
def test_field_numbers_are_talos(message, field: str, number: int) -> None:
    assert _number(message, field) == number


def test_enums_and_paths_are_talos() -> None:
    modes = machine_pb2.ApplyConfigurationRequest.Mode
    assert [modes.Value(n) for n in ("REBOOT", "AUTO", "NO_REBOOT", "STAGED", "TRY")] == [0, 1, 2, 3, 4]
    wipe = machine_pb2.ResetRequest.WipeMode
    assert [wipe.Value(n) for n in ("ALL", "SYSTEM_DISK", "USER_DISKS")] == [0, 1, 2]
    machine = machine_grpc.MachineServiceStub(None)  # type: ignore[arg-type]
    assert machine.Version.name == "/machine.MachineService/Version"
    assert machine.ImagePull.name == "/machine.MachineService/ImagePull"
    assert machine.EtcdRemoveMemberByID.name == "/machine.MachineService/EtcdRemoveMemberByID"
    assert cluster_grpc.ClusterServiceStub(None).HealthCheck.name == "/cluster.ClusterService/HealthCheck"  # type: ignore[arg-type]
    assert state_grpc.StateStub(None).List.name == "/cosi.resource.State/List"  # type: ignore[arg-type]
    assert lifecycle_grpc.LifecycleServiceStub(None).Upgrade.name == "/machine.LifecycleService/Upgrade"  # type: ignore[arg-type]
    assert image_grpc.ImageServiceStub(None).Pull.name == "/machine.ImageService/Pull"  # type: ignore[arg-type]
    assert [common_pb2.ContainerdNamespace.Value(n) for n in ("NS_UNKNOWN", "NS_SYSTEM", "NS_CRI")] == [0, 1, 2]
    reboot = machine_pb2.RebootRequest.Mode
    assert [reboot.Value(n) for n in ("DEFAULT", "POWERCYCLE", "FORCE")] == [0, 1, 2]
    # Empty must encode to zero bytes, as google.protobuf.Empty does on the wire.
    assert machine_pb2.EtcdLeaveClusterRequest().SerializeToString() == b""


def test_emulator_serves_exactly_the_generated_methods() -> None:
    from lab.talos_node.rpc import METHODS

    stubs = [machine_grpc.MachineServiceStub, cluster_grpc.ClusterServiceStub, state_grpc.StateStub,
             lifecycle_grpc.LifecycleServiceStub, image_grpc.ImageServiceStub]
    generated = {
        method.name
        for stub in stubs
        for method in vars(stub(None)).values()  # type: ignore[arg-type]
    }
    assert {m.path for m in METHODS} == generated
