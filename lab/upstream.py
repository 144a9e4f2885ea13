"""Upstream artifacts the lab installs, at the versions pinned in tools/versions.env.

Each comes from its project's Go module zip through the module proxy (`go mod download`, the
only way in here, as for the tools) and is copied once into a cache outside the repo
(~/.cache/kontinuum/upstream/<name>/<version>/, shared with CI), never into the repo:

- cilium: the Cilium chart (github.com/cilium/cilium, install/kubernetes/cilium);
- cert-manager: cert-manager's chart (github.com/cert-manager/cert-manager,
  deploy/charts/cert-manager). The source tree carries Chart.template.yaml, which cert-manager's
  release tooling turns into Chart.yaml with the version filled in; this does the same;
- cert-manager-crds: its CRDs (deploy/crds), for tests that need the kinds without the chart;
- gateway-api: the Gateway API standard-channel CRDs (sigs.k8s.io/gateway-api,
  config/crd/standard).

`link(dest)` points stable names (dest/cilium, dest/cert-manager, dest/gateway-api) at the
cached copies, so a stack config can name them by a fixed relative path (stacks/Pulumi.lab.yaml).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS_FILE = ROOT / "tools" / "versions.env"
DOWNLOAD_TIMEOUT = 600.0  # seconds for one `go mod download` (the Cilium zip is ~30 MB)


def pins() -> dict[str, str]:
    return dict(re.findall(r"^([A-Z_]+)=(\S+)$", PINS_FILE.read_text(), re.M))


@dataclass(frozen=True)
class Artifact:
    name: str
    module: str
    pin: str  # the versions.env key
    subdir: str

    @property
    def version(self) -> str:
        return pins()[self.pin]


ARTIFACTS = {
    a.name: a
    for a in (
        Artifact("cilium", "github.com/cilium/cilium", "CILIUM_VERSION", "install/kubernetes/cilium"),
        Artifact("cert-manager", "github.com/cert-manager/cert-manager", "CERT_MANAGER_VERSION",
                 "deploy/charts/cert-manager"),
        Artifact("cert-manager-crds", "github.com/cert-manager/cert-manager", "CERT_MANAGER_VERSION", "deploy/crds"),
        Artifact("gateway-api", "sigs.k8s.io/gateway-api", "GATEWAY_API_VERSION", "config/crd/standard"),
    )
}


class UpstreamError(RuntimeError):
    pass


def cache_root() -> Path:
    base = os.environ.get("KONTINUUM_UPSTREAM_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "kontinuum" / "upstream"


def module_dir(module: str, version: str, *, timeout: float = DOWNLOAD_TIMEOUT) -> Path:
    """The extracted module zip (downloaded through the proxy if not in the Go module cache)."""
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    try:
        out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], env=env,
                             capture_output=True, text=True, timeout=timeout, cwd=tempfile.gettempdir())
    except FileNotFoundError:
        raise UpstreamError("Go is not installed; the lab reads upstream charts and CRDs from Go module zips") from None
    except subprocess.TimeoutExpired:
        raise UpstreamError(f"`go mod download {module}@{version}` took over {timeout:.0f} s") from None
    try:
        info = json.loads(out.stdout or "{}")
    except ValueError:
        info = {}
    if info.get("Error") or not info.get("Dir"):
        why = info.get("Error") or out.stderr.strip() or f"exit status {out.returncode}"
        raise UpstreamError(f"cannot download {module}@{version} through the module proxy: {why}")
    return Path(info["Dir"])


def _cert_manager_chart_yaml(chart: Path, version: str) -> None:
    """Chart.yaml from Chart.template.yaml, as cert-manager's release tooling writes it."""
    text = (chart / "Chart.template.yaml").read_text()
    text = text.replace("{{IS_PRERELEASE}}", "true" if "-" in version else "false")
    text = re.sub(r"(?m)^version: .*$", f"version: {version}", text)
    text = re.sub(r"(?m)^appVersion: .*$", f"appVersion: {version}", text)
    (chart / "Chart.yaml").write_text(text)
    (chart / "Chart.template.yaml").unlink()


def prepare(name: str) -> Path:
    """The cached copy of one artifact, made on first use (atomically: a half copy is never used)."""
    art = ARTIFACTS[name]
    version = art.version
    dest = cache_root() / name / version
    if dest.is_dir():
        return dest
    src = module_dir(art.module, version) / art.subdir
    if not src.is_dir():
        raise UpstreamError(f"{art.module}@{version} has no {art.subdir}/")
    tmp = dest.with_name(f"{version}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    for p in [tmp, *tmp.rglob("*")]:  # module zips extract read-only
        p.chmod(p.stat().st_mode | 0o200)
    if name == "cert-manager":
        _cert_manager_chart_yaml(tmp, version)
    try:
        tmp.rename(dest)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
        if not dest.is_dir():
            raise
    return dest


def link(dest: Path) -> dict[str, Path]:
    """dest/<name> → the cached copy of each artifact; returns the links."""
    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in ARTIFACTS:
        target = prepare(name)
        path = dest / name
        if not (path.is_symlink() and path.resolve() == target.resolve()):
            tmp = dest / f".{name}.tmp{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(target)
            tmp.replace(path)
        out[name] = path
    return out
