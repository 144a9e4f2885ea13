"""What each Kubernetes minor step removes: the facts talosctl upgrade-k8s checks before it
changes anything (reference/failure-facts.md §4).

Carried over from siderolabs/go-kubernetes v0.2.38 (commit 131a2bd641eb725630ce3c49576a360f69e7ab66,
the version Talos v1.13.9 pins), kubernetes/upgrade/checks.go, `upgradeVersionCheck`: the steps
the stack config can ask for (Talos 1.13 supports Kubernetes 1.31–1.36, kontinuum/talos/support.py).
A same-minor step has no entry: nothing is removed, nothing is checked. Upstream marks
"1.35->1.36" as not final (only feature gates are listed there).

Feature gates are checked on kube-apiserver, kube-controller-manager and kube-scheduler (as
upstream: not on the kubelet); flags per component; admission plugins on kube-apiserver; API
resources as `<resource>.<version>.<group>` (kubectl's resource argument form).
"""

from __future__ import annotations

from dataclasses import dataclass, field

APISERVER, CONTROLLER_MANAGER, SCHEDULER, KUBELET = "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"
STATIC_PODS = (APISERVER, CONTROLLER_MANAGER, SCHEDULER)


@dataclass(frozen=True)
class Removed:
    feature_gates: tuple[str, ...] = ()
    flags: dict[str, tuple[str, ...]] = field(default_factory=dict)  # component → flag names (no `--`)
    admission_plugins: tuple[str, ...] = ()  # kube-apiserver
    api_resources: tuple[str, ...] = ()  # resource.version.group


REMOVED: dict[str, Removed] = {
    "1.31->1.32": Removed(
        feature_gates=("AllowServiceLBStatusOnNonLB", "CloudDualStackNodeIPs", "DRAControlPlaneController",
                       "HPAContainerMetrics", "KMSv2", "KMSv2KDF", "LegacyServiceAccountTokenCleanUp",
                       "MinDomainsInPodTopologySpread", "NewVolumeManagerReconstruction",
                       "NodeOutOfServiceVolumeDetach", "ServerSideApply", "ServerSideFieldValidation",
                       "StableLoadBalancerNodeSet", "ValidatingAdmissionPolicy", "ZeroLimitedNominalConcurrencyShares"),
        api_resources=("podschedulingcontexts.v1alpha3.resource.k8s.io",),
    ),
    "1.32->1.33": Removed(
        feature_gates=("AppArmor", "AppArmorFields", "CPUManager", "DisableCloudProviders",
                       "DisableKubeletCloudCredentialProviders", "JobPodFailurePolicy",
                       "KubeProxyDrainingTerminatingNodes", "PDBUnhealthyPodEvictionPolicy",
                       "PersistentVolumeLastPhaseTransitionTime", "VolumeCapacityPriority"),
        flags={APISERVER: ("cloud-config",)},
    ),
    "1.33->1.34": Removed(
        feature_gates=("DevicePluginCDIDevices", "LegacySidecarContainers", "PodDisruptionConditions"),
        flags={KUBELET: ("cloud-config",)},
    ),
    "1.34->1.35": Removed(
        feature_gates=("SizeMemoryBackedVolumes", "UserNamespacesHostNetworkSupport"),
        flags={KUBELET: ("pod-infra-container-image",)},
    ),
    "1.35->1.36": Removed(
        feature_gates=("CSIMigrationPortworx", "HonorPVReclaimPolicy", "InTreePluginPortworxUnregister",
                       "WatchFromStorageWithoutResourceVersion"),
    ),
}


def _minor(version: str) -> tuple[int, int]:
    major, minor, *_ = version.strip().removeprefix("v").split(".")
    return int(major), int(minor)


def step_of(current: str, target: str) -> str:
    """The table's key for an upgrade, e.g. "1.35->1.36" (the same minor gives "1.35->1.35")."""
    (a, b), (c, d) = _minor(current), _minor(target)
    return f"{a}.{b}->{c}.{d}"


def removed_for(current: str, target: str) -> Removed | None:
    """What the step from `current` to `target` removes; None when nothing is listed for it."""
    return REMOVED.get(step_of(current, target))
