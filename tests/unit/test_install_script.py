"""tools/install.sh from nothing, in seconds: every builder is swapped for a stand-in
(KONTINUUM_FAKE_BUILDERS), so each branch a user meets on a fresh or a used machine runs on
every CI run: build, cached, already on PATH (pinned, newer, wrong), the user's Pulumi plugin
directory, and a failed build."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
INSTALL = ROOT / "tools" / "install.sh"
PINS = dict(re.findall(r"^([A-Z_]+)=(\S+)$", (ROOT / "tools" / "versions.env").read_text(), re.M))
GUARD = ROOT / "tools" / "plugin-guard"  # ours, versioned by its source
GUARD_VERSION = hashlib.sha256((GUARD / "go.mod").read_bytes() + (GUARD / "main.go").read_bytes()).hexdigest()[:12]
TOOLS = {
    "kontinuum-plugin-guard": GUARD_VERSION,
    "pulumi": PINS["PULUMI_VERSION"],
    "pulumi-language-python": PINS["PULUMI_LANGUAGE_PYTHON_VERSION"],
    "pulumi-resource-kubernetes": PINS["PULUMI_KUBERNETES_VERSION"],
    "etcd": PINS["ETCD_VERSION"],
    "etcdutl": PINS["ETCDUTL_VERSION"],
    "kube-apiserver": PINS["KUBERNETES_VERSION"],
    "kube-controller-manager": PINS["KUBERNETES_VERSION"],
    "kube-scheduler": PINS["KUBERNETES_VERSION"],
    "kwok": PINS["KWOK_VERSION"],
    "weed": PINS["SEAWEEDFS_VERSION"],
    "kontinuum-talos-validate": PINS["TALOS_MACHINERY_VERSION"],
    "pebble": PINS["PEBBLE_VERSION"],
    "pebble-challtestsrv": PINS["PEBBLE_VERSION"],
    "cert-manager-controller": PINS["CERT_MANAGER_VERSION"],
    "cert-manager-webhook": PINS["CERT_MANAGER_VERSION"],
    "flux-operator": PINS["FLUX_OPERATOR_VERSION"],
    "talosctl": PINS["TALOSCTL_VERSION"],
    "source-controller": PINS["FLUX_CONTROLLERS_VERSION"],
    "kustomize-controller": PINS["FLUX_CONTROLLERS_VERSION"],
    "notification-controller": PINS["FLUX_NOTIFICATION_CONTROLLER_VERSION"],
}

# A stand-in builder: leaves a binary that reports its version the way the real one does.
FAKE_BUILDER = r"""#!/bin/bash
name=$1 version=$2 out=$3
echo "$name" >>"$FAKE_LOG"
if [[ " $FAKE_FAIL " == *" $name "* ]]; then echo "stand-in build of $name fails" >&2; exit 1; fi
case $name in
  pulumi|kontinuum-talos-validate|kontinuum-plugin-guard|cert-manager-*) body="echo $version" ;;
  pebble) body="echo 'Pebble version: $version'" ;;
  etcd) body="echo 'etcd Version: ${version#v}'" ;;
  etcdutl) body="printf 'etcdutl version: %s\\nAPI version: 3.6\\n' ${version#v}" ;;
  kube-*) body="echo 'Kubernetes $version'" ;;
  kwok) body="echo 'kwok version $version go1.26'" ;;
  weed) body="echo 'version 30GB 4.53 $version linux amd64'" ;;
  talosctl) body="printf 'Client:\\nTalos %s\\n' $version" ;;
  *) body="exit 0" ;;
esac
printf '#!/bin/sh\n%s\n' "$body" >"$out/$name"
chmod +x "$out/$name"
"""


class Machine:
    """A throwaway home, cache and PATH: nothing of the real machine's tools is visible."""

    def __init__(self, root: Path):
        self.root = root
        self.cache = root / "cache"
        self.userbin = root / "userbin"
        self.userbin.mkdir()
        self.log = root / "built.log"
        self.fake = root / "fake-builder"
        self.fake.write_text(FAKE_BUILDER)
        self.fake.chmod(0o755)
        self.fail = ""

    def run(self, *args: str) -> subprocess.CompletedProcess:
        env = {
            "HOME": str(self.root / "home"), "PATH": f"{self.userbin}:/usr/bin:/bin",
            "KONTINUUM_TOOLS_CACHE": str(self.cache), "KONTINUUM_FAKE_BUILDERS": str(self.fake),
            "FAKE_LOG": str(self.log), "FAKE_FAIL": self.fail,
        }
        return subprocess.run(["bash", str(INSTALL), *args], env=env, capture_output=True, text=True, timeout=60)

    def built(self) -> list[str]:
        names = self.log.read_text().split() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return names

    def bin(self) -> Path:
        return Path(self.run("--print-bin").stdout.strip())

    def on_path(self, name: str, script: str) -> Path:
        path = self.userbin / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)
        return path


@pytest.fixture
def machine(tmp_path) -> Machine:
    return Machine(tmp_path)


def test_fresh_machine_builds_everything_once_then_reuses_it(machine):
    first = machine.run()
    assert first.returncode == 0, first.stderr
    assert sorted(machine.built()) == sorted(TOOLS)
    for name, version in TOOLS.items():
        assert f"[tools] {name} {version}: built in " in first.stderr
        assert (machine.bin() / name).resolve() == machine.cache / name / version / name
    assert first.stdout.strip() == str(machine.bin())

    again = machine.run()
    assert again.returncode == 0 and machine.built() == []
    assert all(f"{name} {version}: ready" in again.stderr for name, version in TOOLS.items())


def test_a_new_tool_directory_reuses_the_cached_builds(machine):
    assert machine.run().returncode == 0
    machine.built()
    for link in machine.bin().iterdir():
        link.unlink()  # e.g. a changed pin elsewhere: a new directory, same cached versions
    out = machine.run()
    assert out.returncode == 0 and machine.built() == []
    assert all(f"{name} {version}: cached" in out.stderr for name, version in TOOLS.items())


def test_pinned_or_newer_engine_on_path_is_used_without_a_build(machine):
    major, minor, patch = PINS["PULUMI_VERSION"].lstrip("v").split(".")
    for version in (PINS["PULUMI_VERSION"], f"v{major}.{int(minor) + 3}.0"):
        engine = machine.on_path("pulumi", f"echo {version}")
        (machine.bin() / "pulumi").unlink(missing_ok=True)
        out = machine.run("pulumi")
        assert out.returncode == 0, out.stderr
        assert machine.built() == []
        copy = machine.cache / "pulumi" / version / "pulumi"  # beside it no bundled plugins: ours are used
        assert f"using {engine} ({version}), already installed (copied to {copy.parent})" in out.stderr
        assert (machine.bin() / "pulumi").resolve() == copy and copy.read_bytes() == engine.read_bytes()
        assert f"pulumi {PINS['PULUMI_VERSION']}: ready ({version}: {copy})" in machine.run("pulumi").stderr


@pytest.mark.parametrize("reported", ["v3.1.0", "v4.0.0", "v3.274.1-dev", ""])
def test_older_other_major_or_unknown_engine_on_path_is_not_used(machine, reported):
    engine = machine.on_path("pulumi", f"echo '{reported}'")
    out = machine.run("pulumi")
    assert out.returncode == 0, out.stderr
    assert machine.built() == ["pulumi"]
    assert f"not using {engine} (it reports '{reported or 'no version'}')" in out.stderr
    assert f"pulumi {PINS['PULUMI_VERSION']}: building from its Go module" in out.stderr
    assert (machine.bin() / "pulumi").resolve() == machine.cache / "pulumi" / PINS["PULUMI_VERSION"] / "pulumi"


def test_exact_pin_required_for_other_tools_on_path(machine):
    machine.on_path("etcd", "echo 'etcd Version: 3.5.0'")
    good = machine.on_path("kwok", f"echo 'kwok version {PINS['KWOK_VERSION']} go1.26'")
    machine.on_path("weed", "echo 'version 30GB 4.53 v0.0.0-20250101000000-000000000000 linux amd64'")
    out = machine.run("etcd", "kwok", "weed")
    assert out.returncode == 0, out.stderr
    assert sorted(machine.built()) == ["etcd", "weed"]  # an S3 server of another commit is not the pinned one
    assert (machine.bin() / "kwok").resolve() == good


def test_kubernetes_provider_from_the_users_pulumi_plugin_directory(machine):
    version = PINS["PULUMI_KUBERNETES_VERSION"]
    plugin = machine.root / "home" / ".pulumi" / "plugins" / f"resource-kubernetes-v{version}" / "pulumi-resource-kubernetes"
    plugin.parent.mkdir(parents=True)
    plugin.write_text("#!/bin/sh\n")
    plugin.chmod(0o755)
    other = plugin.parents[1] / "resource-kubernetes-v4.18.0" / "pulumi-resource-kubernetes"
    other.parent.mkdir()
    out = machine.run("pulumi-resource-kubernetes")
    assert out.returncode == 0, out.stderr
    assert machine.built() == []
    assert f"using {plugin} ({version}), already installed" in out.stderr

    machine.on_path("pulumi-resource-kubernetes", "exit 0")  # unversioned, on PATH: the plugin dir still wins
    (machine.bin() / "pulumi-resource-kubernetes").unlink()
    out = machine.run("pulumi-resource-kubernetes")
    assert out.returncode == 0 and machine.built() == []
    assert f"using {plugin} ({version}), already installed" in out.stderr

    plugin.unlink()  # only another version installed: build the pinned one
    (machine.bin() / "pulumi-resource-kubernetes").unlink()
    out = machine.run("pulumi-resource-kubernetes")
    assert out.returncode == 0 and machine.built() == ["pulumi-resource-kubernetes"]


def test_failed_build_is_named_and_leaves_no_half_built_cache_while_the_others_finish(machine):
    machine.fail = "etcd"
    out = machine.run()
    assert out.returncode == 1
    assert f"[tools] cannot provide etcd {PINS['ETCD_VERSION']}: the Go build failed" in out.stderr
    assert "stand-in build of etcd fails" in out.stderr
    assert "[tools] not provided (see above): etcd etcdutl" in out.stderr
    assert out.stdout == ""  # no tool directory for a caller to use
    assert not (machine.cache / "etcd" / PINS["ETCD_VERSION"]).exists()
    assert not (machine.cache / "etcd" / f"{PINS['ETCD_VERSION']}.tmp").exists()
    # etcdutl waits for etcd (one unit); every other tool is built and cached for the next run
    assert sorted(machine.built()) == sorted(set(TOOLS) - {"etcdutl"})

    machine.fail = ""
    out = machine.run()
    assert out.returncode == 0, out.stderr
    assert sorted(machine.built()) == ["etcd", "etcdutl"]


PRODUCT = ["kontinuum-plugin-guard", "kontinuum-talos-validate", "pulumi", "pulumi-language-python", "pulumi-resource-kubernetes"]
LAB = PRODUCT + ["cert-manager-controller", "cert-manager-webhook", "etcd", "etcdutl", "kube-apiserver",
                 "kube-controller-manager", "kube-scheduler", "kwok", "pebble", "pebble-challtestsrv"]


@pytest.mark.parametrize("args, tools", [(("product",), PRODUCT), (("lab",), LAB), (("product", "etcd"), PRODUCT + ["etcd"]),
                                         ((), list(TOOLS))])
def test_tool_sets_build_only_what_their_job_runs(machine, args, tools):
    out = machine.run(*args)
    assert out.returncode == 0, out.stderr
    assert sorted(machine.built()) == sorted(tools)
    assert sorted(p.name for p in machine.bin().iterdir()) == sorted(tools)


def test_an_unknown_tool_is_refused_naming_the_sets(machine):
    out = machine.run("kubectl")
    assert out.returncode == 1 and machine.built() == []
    assert "cannot provide kubectl: no such tool" in out.stderr and "sets: product, lab, all" in out.stderr


def test_print_bin_needs_nothing_installed(machine):
    out = machine.run("--print-bin")
    assert out.returncode == 0 and out.stdout.strip().startswith(str(machine.cache))
    assert not machine.cache.exists()


def test_pebble_on_path_is_used_when_pinned_and_its_unversioned_test_server_is_built(machine):
    good = machine.on_path("pebble", f"echo 'Pebble version: {PINS['PEBBLE_VERSION']}'")
    machine.on_path("pebble-challtestsrv", "exit 0")  # reports no version: never taken on trust
    machine.on_path("cert-manager-controller", "echo v1.18.0")
    out = machine.run("pebble", "pebble-challtestsrv", "cert-manager-controller")
    assert out.returncode == 0, out.stderr
    assert sorted(machine.built()) == ["cert-manager-controller", "pebble-challtestsrv"]
    assert (machine.bin() / "pebble").resolve() == good
    assert f"cert-manager-controller {PINS['CERT_MANAGER_VERSION']}: not using" in out.stderr and "(it reports 'v1.18.0')" in out.stderr


def test_the_tool_directory_follows_the_guards_source(machine, tmp_path):
    """Checkouts whose guard differs never share a tool directory (nor a guard)."""
    copy = tmp_path / "checkout" / "tools"
    copy.mkdir(parents=True)
    for f in ("install.sh", "versions.env"):
        (copy / f).write_bytes((ROOT / "tools" / f).read_bytes())
    (copy / "install.sh").chmod(0o755)
    (copy / "plugin-guard").mkdir()
    (copy / "plugin-guard" / "go.mod").write_bytes((GUARD / "go.mod").read_bytes())
    (copy / "plugin-guard" / "main.go").write_bytes((GUARD / "main.go").read_bytes())
    env = {"HOME": str(machine.root / "home"), "PATH": "/usr/bin:/bin", "KONTINUUM_TOOLS_CACHE": str(machine.cache)}

    def bin_of(install: Path) -> str:
        return subprocess.run(["bash", str(install), "--print-bin"], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()

    assert bin_of(copy / "install.sh") == bin_of(INSTALL)
    with open(copy / "plugin-guard" / "main.go", "a") as f:
        f.write("// changed\n")
    assert bin_of(copy / "install.sh") != bin_of(INSTALL)


def test_talosctl_on_path_is_used_only_at_the_pinned_tag(machine):
    """The conformance client must be Talos's CLI of the pinned release, never the user's other one."""
    pinned = PINS["TALOSCTL_VERSION"]
    good = machine.on_path("talosctl", f"printf 'Client:\\nTalos {pinned}\\n'")
    out = machine.run("talosctl")
    assert out.returncode == 0, out.stderr
    assert machine.built() == [] and (machine.bin() / "talosctl").resolve() == good

    other = machine.on_path("talosctl", "printf 'Client:\\nTalos v1.12.4\\n'")
    (machine.bin() / "talosctl").unlink()
    out = machine.run("talosctl")
    assert out.returncode == 0, out.stderr
    assert machine.built() == ["talosctl"]
    assert f"not using {other} (it reports 'v1.12.4')" in out.stderr
    assert (machine.bin() / "talosctl").resolve() == machine.cache / "talosctl" / pinned / "talosctl"
