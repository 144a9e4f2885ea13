"""The knobs a test turns to make an emulated node misbehave (EmulatedNode.set_faults)."""

from __future__ import annotations

from dataclasses import dataclass

from grpclib.const import Status


@dataclass(frozen=True)
class Faults:
    """Knobs a test turns to make the node misbehave."""

    latency: float = 0.0  # seconds added before every call is handled
    hang: bool = False  # accept calls but never answer them
    refuse: bool = False  # stop listening (connection refused) and drop open connections
    reboot_delay: float = 1.0  # seconds a reboot keeps the node off the network
    # Seconds from a boot (or a live kubelet restart) until the kubelet runs again: until then no
    # kubelet renews the Node's Lease or reports its status (kubelet.py, lab/cluster_nodes.py).
    kubelet_delay: float = 0.5
    fail_next: int = 0  # the next N calls fail with fail_status
    fail_status: Status = Status.UNAVAILABLE
    fail_message: str = "injected failure"
    # Boots from the network when its disk holds no OS: after a whole-disk reset it comes back in
    # maintenance mode only then; otherwise it stays off the network, as real hardware would.
    netboot: bool = False
    # OS upgrades (upgrade.py): seconds the installer runs, and "", "fail", "rollback" or "hang".
    install_delay: float = 0.2
    upgrade_fault: str = ""
    # Image pulls (MachineService.ImagePull, ImageService.Pull): a pull whose reference contains
    # this text fails as a registry without that image makes it fail ("" pulls everything).
    pull_fault: str = ""
