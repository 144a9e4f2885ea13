"""The emulated node's OS upgrade surface: ImageService.Pull, LifecycleService.Upgrade,
MachineService.Reboot and MachineService.Read (for the boot id), as talosctl 1.13 uses them
(reference/day2-facts.md §1), and the legacy MachineService.ImagePull that talosctl upgrade-k8s
pre-pulls Kubernetes images with (§2). Every pull is counted (node.calls) and logged ("pulled",
with namespace and image); the `pull_fault` knob makes matching pulls fail as a registry
without the image does (NotFound).

Upgrade installs the installer image's Talos version to the (emulated) inactive partition and
streams progress, ending with an exit code; it neither reboots nor checks etcd, as in Talos.
The next reboot boots the installed version, unless the `upgrade_fault` knob says otherwise:
  fail      the installer exits non-zero; nothing is installed
  rollback  the install succeeds but the new version fails to boot, so the machine comes back on
            the old one (A/B fallback)
  hang      the installer never finishes (the call hangs until the client gives up)
Every step lands in the node's event log (node.events), which tests read to prove order.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import AsyncIterator

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from lab.talos_node.call import Call
from lab.talos_node.node import EmulatedNode
from protos.gen.common import common_pb2
from protos.gen.machine import image_pb2, lifecycle_pb2, machine_pb2

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
UPGRADE_FAULTS = ("", "fail", "rollback", "hang")
_TAG = re.compile(r":(v\d+\.\d+\.\d+[^@/:]*)(@sha256:[0-9a-f]+)?$")


def installer_version(image: str) -> str | None:
    """The Talos version an installer image carries in its tag (None when it has none)."""
    match = _TAG.search(image)
    return match.group(1) if match else None


def _progress(message: str | None = None, exit_code: int | None = None) -> lifecycle_pb2.LifecycleServiceUpgradeResponse:
    progress = lifecycle_pb2.LifecycleServiceInstallProgress()
    if exit_code is None:
        progress.message = message or ""
    else:
        progress.exit_code = exit_code
    return lifecycle_pb2.LifecycleServiceUpgradeResponse(progress=progress)


class UpgradeApi:
    def __init__(self, node: EmulatedNode) -> None:
        self.node = node

    def _pull(self, namespace: int, image: str) -> None:
        if not image:
            raise GRPCError(Status.INVALID_ARGUMENT, "image reference is required")
        fault = self.node.faults.pull_fault
        if fault and fault in image:
            self.node.record("pull-failed", image=image)
            raise GRPCError(Status.NOT_FOUND, f"failed to pull image {image!r}: {image}: not found (injected failure)")
        self.node.pulled.add((namespace, image))
        self.node.record("pulled", image=image, namespace=common_pb2.ContainerdNamespace.Name(namespace))

    async def image_pull(self, call: Call, request) -> AsyncIterator[image_pb2.ImageServicePullResponse]:
        self._pull(request.containerd.namespace, request.image_ref)
        yield image_pb2.ImageServicePullResponse(name=request.image_ref)

    async def legacy_image_pull(self, call: Call, request) -> machine_pb2.ImagePullResponse:
        self._pull(request.namespace, request.reference)
        return machine_pb2.ImagePullResponse(messages=[machine_pb2.ImagePull()])

    async def lifecycle_upgrade(self, call: Call, request) -> AsyncIterator[lifecycle_pb2.LifecycleServiceUpgradeResponse]:
        node = self.node
        image = request.source.image_name
        if not image:
            raise GRPCError(Status.INVALID_ARGUMENT, "installer image name is required")
        if node.upgrading:
            raise GRPCError(Status.FAILED_PRECONDITION, "another installation/upgrade is already in progress")
        node.upgrading = True
        try:
            node.record("upgrade", image=image, running=node.talos_version)
            yield _progress(f"pulling installer image {image}")
            fault = node.faults.upgrade_fault
            if fault == "hang":
                while True:  # until the client cancels the call
                    await asyncio.sleep(0.05)
            version = installer_version(image)
            if version is None:
                yield _progress(f"error: installer image {image} has no Talos version tag")
                yield _progress(exit_code=1)
                return
            await asyncio.sleep(node.faults.install_delay)
            if fault == "fail":
                node.record("upgrade-failed", image=image)
                yield _progress("installer failed: error writing the boot partition (injected failure)")
                yield _progress(exit_code=1)
                return
            node.staged_version = version
            node.record("installed", version=version)
            yield _progress(f"installed Talos {version}; it boots on the next reboot")
            yield _progress(exit_code=0)
        finally:
            node.upgrading = False

    async def reboot(self, call: Call, request) -> machine_pb2.RebootResponse:
        node = self.node
        node.record("reboot-requested", mode=machine_pb2.RebootRequest.Mode.Name(request.mode))
        force = request.mode == machine_pb2.RebootRequest.FORCE  # skips the graceful phases (the kubelet's too)
        call.after_reply.append(lambda: node.schedule_reboot(None, graceful=not force))
        return machine_pb2.RebootResponse(messages=[machine_pb2.Reboot(actor_id=str(uuid.uuid4()))])

    async def read(self, call: Call, request) -> AsyncIterator[common_pb2.Data]:
        if request.path != BOOT_ID_PATH:
            raise GRPCError(Status.UNKNOWN, f"open {request.path}: no such file or directory")
        yield common_pb2.Data(bytes=(self.node.boot_id + "\n").encode())
