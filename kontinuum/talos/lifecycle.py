"""The Talos calls of an OS upgrade, the way talosctl 1.13 makes them (day2-facts §1):
ImageService.Pull of the installer, LifecycleService.Upgrade (server-streaming: progress lines,
then an exit code, which must be 0), MachineService.Reboot, and the boot id read through
MachineService.Read so a waiter can tell the reboot happened. Also the pre-pull of a Kubernetes
upgrade (§2 phase 1), which talosctl upgrade-k8s makes with the legacy MachineService.ImagePull.

Each call is bounded like every TalosClient operation and raises the same typed errors.
"""

from __future__ import annotations

from typing import Any, Callable

from grpclib.const import Status

from kontinuum.talos.answers import check_messages
from kontinuum.talos.client import TalosClient
from kontinuum.talos.errors import PermissionDeniedError, TalosApiError, WrongModeError
from protos.gen.common import common_pb2
from protos.gen.machine import image_grpc, image_pb2, lifecycle_grpc, lifecycle_pb2, machine_grpc, machine_pb2

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
NAMESPACES = {"system": common_pb2.NS_SYSTEM, "cri": common_pb2.NS_CRI}
REBOOT_MODES = {"default": machine_pb2.RebootRequest.DEFAULT, "powercycle": machine_pb2.RebootRequest.POWERCYCLE}
PULL_DEADLINE = 300.0  # an installer image is a few hundred MB
UPGRADE_DEADLINE = 600.0  # the installer writes the inactive boot partition
SHORT_DEADLINE = 15.0


class InstallerFailedError(TalosApiError):
    """The installer ran and exited non-zero: nothing new will boot."""

    remedy = ("The node keeps running its current version. Check the installer image (does it exist, "
              "is it the right platform?) and the node's logs, then run `pulumi up` again.")


def pull_installer(client: TalosClient, image: str, *, namespace: str = "system", timeout: float | None = None) -> str:
    """Pull `image` into the node's containerd namespace; returns the name the node resolved."""
    request = image_pb2.ImageServicePullRequest(
        containerd=common_pb2.ContainerdInstance(driver=common_pb2.CONTAINERD, namespace=NAMESPACES[namespace]),
        image_ref=image)

    async def body(channel: Any, md: dict, t: float) -> str:
        replies = await image_grpc.ImageServiceStub(channel).Pull(request, timeout=t, metadata=md)
        names = [r.name for r in replies if r.WhichOneof("response") == "name"]
        return names[-1] if names else image

    return client._run("image-pull", timeout or PULL_DEADLINE, body)


def pre_pull(client: TalosClient, image: str, *, namespace: str, timeout: float | None = None) -> bool:
    """Pull `image` into the node's containerd namespace as talosctl upgrade-k8s does (unary
    MachineService.ImagePull). False when the node does not implement it (talosctl skips such a
    node too); any other refusal raises the call's typed error."""
    request = machine_pb2.ImagePullRequest(namespace=NAMESPACES[namespace], reference=image)

    async def body(channel: Any, md: dict, t: float) -> None:
        reply = await machine_grpc.MachineServiceStub(channel).ImagePull(request, timeout=t, metadata=md)
        check_messages(reply.messages, client.node, "image-pull")

    try:
        client._run("image-pull", timeout or PULL_DEADLINE, body)
    except WrongModeError as e:
        if e.status is not Status.UNIMPLEMENTED:
            raise
        return False
    return True


def install_upgrade(client: TalosClient, image: str, *, namespace: str = "system",
                    on_progress: Callable[[str], None] | None = None, timeout: float | None = None) -> list[str]:
    """Run the installer of `image` on the node (LifecycleService.Upgrade); returns its output.
    Raises InstallerFailedError on a non-zero exit code and TalosApiError when the stream ends
    without one."""
    request = lifecycle_pb2.LifecycleServiceUpgradeRequest(
        containerd=common_pb2.ContainerdInstance(driver=common_pb2.CONTAINERD, namespace=NAMESPACES[namespace]),
        source=lifecycle_pb2.InstallArtifactsSource(image_name=image))
    lines: list[str] = []

    async def body(channel: Any, md: dict, t: float) -> list[str]:
        stub = lifecycle_grpc.LifecycleServiceStub(channel)
        async with stub.Upgrade.open(timeout=t, metadata=md) as stream:
            await stream.send_message(request, end=True)
            async for reply in stream:
                progress = reply.progress
                if progress.WhichOneof("response") == "exit_code":
                    if progress.exit_code != 0:
                        last = f"; last output: {lines[-1]}" if lines else ""
                        raise InstallerFailedError(client.node, "upgrade",
                                                   f"the installer of {image} exited with code {progress.exit_code}{last}")
                    return lines
                lines.append(progress.message)
                if on_progress is not None:
                    on_progress(progress.message)
        raise TalosApiError(client.node, "upgrade", f"the upgrade stream ended without an exit code (output: {lines})")

    return client._run("upgrade", timeout or UPGRADE_DEADLINE, body)


def reboot(client: TalosClient, *, mode: str = "default", timeout: float | None = None) -> str:
    """Ask the node to reboot; returns the actor id of the reboot."""

    async def body(channel: Any, md: dict, t: float) -> str:
        reply = await machine_grpc.MachineServiceStub(channel).Reboot(
            machine_pb2.RebootRequest(mode=REBOOT_MODES[mode]), timeout=t, metadata=md)
        check_messages(reply.messages, client.node, "reboot")
        return reply.messages[0].actor_id if reply.messages else ""

    return client._run("reboot", timeout or SHORT_DEADLINE, body)


def boot_id(client: TalosClient, *, timeout: float | None = None) -> str | None:
    """The node's boot id, which changes with every boot (None when the role may not read it:
    talosctl then skips its boot-id check too)."""

    async def body(channel: Any, md: dict, t: float) -> str:
        chunks = await machine_grpc.MachineServiceStub(channel).Read(
            machine_pb2.ReadRequest(path=BOOT_ID_PATH), timeout=t, metadata=md)
        check_messages(chunks, client.node, "read")
        return b"".join(c.bytes for c in chunks).decode().strip()

    try:
        return client._run("read", timeout or SHORT_DEADLINE, body)
    except PermissionDeniedError:
        return None
