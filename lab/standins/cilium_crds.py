"""The Cilium CRDs the Gateway stand-in registers, read from the pinned upstream Go module.

The Cilium operator registers its own CRDs when it starts (the chart ships none); the lab's
operator pod is kwok-played, so the stand-in registers the LB-IPAM and L2-announcement CRDs in
its place, from `github.com/cilium/cilium@v<chart version>` fetched through the Go module proxy
into the module cache (`go mod download`, bounded), never copied into the repo.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import yaml

from kontinuum.stackconfig.contract import DEFAULT_CHARTS

MODULE = "github.com/cilium/cilium"
VERSION = "v" + DEFAULT_CHARTS["cilium"]["version"].lstrip("v")
CRD_FILES = ("pkg/k8s/apis/cilium.io/client/crds/v2/ciliumloadbalancerippools.yaml",
             "pkg/k8s/apis/cilium.io/client/crds/v2alpha1/ciliuml2announcementpolicies.yaml")
DOWNLOAD_TIMEOUT = 600.0  # seconds: a cold download of the module zip through the proxy

_lock = threading.Lock()
_cache: dict[str, list[dict]] = {}


class UpstreamUnavailable(RuntimeError):
    """The module could not be fetched (no Go, no proxy, timeout)."""


def module_dir(module: str = MODULE, version: str = VERSION, *, timeout: float = DOWNLOAD_TIMEOUT) -> Path:
    """The extracted module in the Go module cache, downloading it once if needed."""
    try:
        out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True,
                             text=True, timeout=timeout, cwd="/", check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UpstreamUnavailable(f"go mod download {module}@{version}: {e}") from None
    try:
        info = json.loads(out.stdout)
    except ValueError:
        raise UpstreamUnavailable(f"go mod download {module}@{version} failed: {out.stderr.strip()[-300:]}") from None
    if info.get("Error") or not info.get("Dir"):
        raise UpstreamUnavailable(f"go mod download {module}@{version}: {info.get('Error') or 'no Dir'}")
    return Path(info["Dir"])


def crds(version: str = VERSION) -> list[dict]:
    """The CiliumLoadBalancerIPPool and CiliumL2AnnouncementPolicy CRDs of that Cilium version."""
    with _lock:
        if version not in _cache:
            root = module_dir(version=version)
            _cache[version] = [yaml.safe_load((root / f).read_text()) for f in CRD_FILES]
        return _cache[version]
