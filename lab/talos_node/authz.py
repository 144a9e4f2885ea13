"""Talos v1.13.0's authorization table, as machined's authz middleware applies it
(internal/app/machined/pkg/system/services/machined.go `rules`, FallbackRoles os:admin; role
names from pkg/machinery/role): a caller whose certificate carries none of a method's roles is
answered PermissionDenied "not authorized" before the method runs. The emulated node takes
every method's roles from here, also for the methods it does not serve (those it refuses as
Talos would before answering Unimplemented). ApplyConfiguration and BlockDeviceWipe list
os:reader for maintenance mode only; their handlers refuse it on a configured node."""

from __future__ import annotations

ADMIN, OPERATOR, READER = "os:admin", "os:operator", "os:reader"
ETCD_BACKUP, IMAGE_VERIFIER, META_WRITER = "os:etcd:backup", "os:image:verifier", "os:meta:writer"
FALLBACK = frozenset({ADMIN})


def _set(*roles: str) -> frozenset[str]:
    return frozenset(roles)


RULES: dict[str, frozenset[str]] = {
    "/cluster.ClusterService/HealthCheck": _set(ADMIN, OPERATOR, READER),
    "/inspect.InspectService/ControllerRuntimeDependencies": _set(ADMIN, OPERATOR, READER),
    "/machine.ImageService/Import": _set(ADMIN),
    "/machine.ImageService/List": _set(ADMIN, OPERATOR, READER),
    "/machine.ImageService/Pull": _set(ADMIN, OPERATOR),
    "/machine.ImageService/Remove": _set(ADMIN),
    "/machine.ImageService/Verify": _set(ADMIN, OPERATOR, READER, IMAGE_VERIFIER),
    "/machine.DebugService/ContainerRun": _set(ADMIN),
    "/machine.LifecycleService/Install": _set(ADMIN),
    "/machine.LifecycleService/Upgrade": _set(ADMIN),
    "/machine.MachineService/ApplyConfiguration": _set(ADMIN, READER),
    "/machine.MachineService/Bootstrap": _set(ADMIN),
    "/machine.MachineService/CPUInfo": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/CPUFreqStats": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/Containers": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/Copy": _set(ADMIN),
    "/machine.MachineService/DiskStats": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/DiskUsage": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/Dmesg": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/EtcdAlarmList": _set(ADMIN, OPERATOR, READER, ETCD_BACKUP),
    "/machine.MachineService/EtcdAlarmDisarm": _set(ADMIN, OPERATOR),
    "/machine.MachineService/EtcdDefragment": _set(ADMIN, OPERATOR),
    "/machine.MachineService/EtcdForfeitLeadership": _set(ADMIN),
    "/machine.MachineService/EtcdLeaveCluster": _set(ADMIN),
    "/machine.MachineService/EtcdMemberList": _set(ADMIN, OPERATOR, READER, ETCD_BACKUP),
    "/machine.MachineService/EtcdRecover": _set(ADMIN),
    "/machine.MachineService/EtcdRemoveMemberByID": _set(ADMIN),
    "/machine.MachineService/EtcdSnapshot": _set(ADMIN, OPERATOR, ETCD_BACKUP),
    "/machine.MachineService/EtcdStatus": _set(ADMIN, OPERATOR, READER, ETCD_BACKUP),
    "/machine.MachineService/EtcdDowngradeCancel": _set(ADMIN),
    "/machine.MachineService/EtcdDowngradeEnable": _set(ADMIN),
    "/machine.MachineService/EtcdDowngradeValidate": _set(ADMIN),
    "/machine.MachineService/Events": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/GenerateClientConfiguration": _set(ADMIN),
    "/machine.MachineService/Hostname": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/ImageList": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/ImagePull": _set(ADMIN, OPERATOR),
    "/machine.MachineService/Kubeconfig": _set(ADMIN),
    "/machine.MachineService/List": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/LoadAvg": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/Logs": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/LogsContainers": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/Memory": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/MetaWrite": _set(ADMIN, META_WRITER),
    "/machine.MachineService/MetaDelete": _set(ADMIN, META_WRITER),
    "/machine.MachineService/Mounts": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/NetworkDeviceStats": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/Netstat": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/PacketCapture": _set(ADMIN, OPERATOR),
    "/machine.MachineService/Processes": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/Read": _set(ADMIN),
    "/machine.MachineService/Reboot": _set(ADMIN, OPERATOR),
    "/machine.MachineService/Reset": _set(ADMIN),
    "/machine.MachineService/Restart": _set(ADMIN, OPERATOR),
    "/machine.MachineService/Rollback": _set(ADMIN),
    "/machine.MachineService/ServiceList": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/ServiceRestart": _set(ADMIN, OPERATOR),
    "/machine.MachineService/ServiceStart": _set(ADMIN, OPERATOR),
    "/machine.MachineService/ServiceStop": _set(ADMIN, OPERATOR),
    "/machine.MachineService/Shutdown": _set(ADMIN, OPERATOR),
    "/machine.MachineService/Stats": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/SystemStat": _set(ADMIN, OPERATOR, READER),
    "/machine.MachineService/Upgrade": _set(ADMIN),
    "/machine.MachineService/Version": _set(ADMIN, OPERATOR, READER),
    "/cosi.resource.State/Create": _set(ADMIN),
    "/cosi.resource.State/Destroy": _set(ADMIN),
    "/cosi.resource.State/Get": _set(ADMIN, OPERATOR, READER),
    "/cosi.resource.State/List": _set(ADMIN, OPERATOR, READER),
    "/cosi.resource.State/Update": _set(ADMIN),
    "/cosi.resource.State/Watch": _set(ADMIN, OPERATOR, READER),
    "/storage.StorageService/Disks": _set(ADMIN, OPERATOR, READER),
    "/storage.StorageService/BlockDeviceWipe": _set(ADMIN, READER),
    "/time.TimeService/Time": _set(ADMIN, OPERATOR, READER),
    "/time.TimeService/TimeCheck": _set(ADMIN, OPERATOR, READER),
}


def allowed(path: str) -> frozenset[str]:
    """The roles that may call `/<service>/<method>`."""
    return RULES.get(path, FALLBACK)


def authorized(roles: frozenset[str], path: str) -> bool:
    return bool(roles & allowed(path))
