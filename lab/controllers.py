"""kube-controller-manager's and kube-scheduler's flags in an emulated cluster's control plane
(lab/controlplane.py runs one of each, as the leader Talos's control planes elect)."""

from __future__ import annotations

NODE_MONITOR_GRACE = 24  # seconds without a Lease renewal before a Node is Unknown (kwok renews every 3 s)


def controller_manager_argv(*, address: str, port: int, kubeconfig: str, ca: str, ca_key: str, sa_key: str,
                            pod_cidr: str, service_cidr: str) -> list[str]:
    return [
        "kube-controller-manager", f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}", f"--bind-address={address}", f"--secure-port={port}",
        f"--root-ca-file={ca}", f"--service-account-private-key-file={sa_key}",
        f"--cluster-signing-cert-file={ca}", f"--cluster-signing-key-file={ca_key}",
        "--use-service-account-credentials=true", "--allocate-node-cidrs=true",
        f"--cluster-cidr={pod_cidr}", f"--service-cluster-ip-range={service_cidr}",
        "--leader-elect=false", "--controllers=*,-nodeipam,-ttl,-bootstrapsigner,-tokencleaner",
        # A stopped kubelet's Node turns Unknown (its pods not Ready) NODE_MONITOR_GRACE after its
        # last Lease renewal (default 50 s), noticed within 2 s (default 5 s).
        f"--node-monitor-grace-period={NODE_MONITOR_GRACE}s", "--node-monitor-period=2s",
        "--v=0",
    ]


def scheduler_argv(*, address: str, port: int, kubeconfig: str) -> list[str]:
    return [
        "kube-scheduler", f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}", f"--bind-address={address}", f"--secure-port={port}",
        "--leader-elect=false", "--v=0",
    ]
