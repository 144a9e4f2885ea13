"""`zones[].flux`: defaults that match the pinned Flux Operator, and bad input named by path
before anything is registered, without ever quoting a secret."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kontinuum.stackconfig import flux_contract, validation
from kontinuum.stackconfig.model import StackConfig
from kontinuum.stackconfig.parse import problems
from tests.unit.test_stack_config import FULL

ROOT = Path(__file__).parents[2]
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
TOKEN = "ghp_secrettoken0123456789"


def stack(flux: dict, *, secret=frozenset({"zones"})) -> tuple[StackConfig | None, list[str]]:
    raw = copy.deepcopy(FULL)
    raw["zones"][0]["flux"] = flux
    st, errs = problems(raw, secret_keys=secret)
    return st, [str(e) for e in errs]


def test_defaults_follow_region_zone_and_the_pinned_operator():
    st, errs = stack({"source": {"url": "https://git.example.com/org/fleet.git"}})
    assert errs == []
    f = st.zones[0].flux
    assert (f.active.url, f.active.ref, f.active.path, f.active.kind) == (
        "https://git.example.com/org/fleet.git", "refs/heads/main", "clusters/eu/eu-1a", "GitRepository")
    assert f.interval == "1m" and f.namespace == "flux-system" and f.apps == ("apps",)
    assert f.version == "2.9.x" and f.registry == "ghcr.io/fluxcd"
    assert f.components == ("source-controller", "kustomize-controller", "helm-controller", "notification-controller")
    pinned = re.search(r"^FLUX_OPERATOR_VERSION=(\S+)$", (ROOT / "tools/versions.env").read_text(), re.M).group(1)
    assert flux_contract.OPERATOR_VERSION == pinned
    assert f.chart == {"repo": "oci://ghcr.io/controlplaneio-fluxcd/charts", "chart": "flux-operator",
                       "version": pinned.lstrip("v"), "namespace": "flux-system"}
    # the newest Flux the pinned operator ships is what the default range selects
    data = Path(subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip())
    shipped = data / f"github.com/controlplaneio-fluxcd/flux-operator@{pinned}/config/data/flux"
    if shipped.is_dir():
        newest = max((p.name for p in shipped.iterdir()), key=lambda v: tuple(map(int, v[1:].split("."))))
        assert newest.startswith("v2.9.")
    oci = stack({"source": {"url": "oci://ghcr.io/org/fleet"}})[0].zones[0].flux.active
    assert (oci.kind, oci.ref) == ("OCIRepository", "latest")


def test_fallback_switches_only_the_active_source():
    flux = {"source": {"url": "ssh://git@github.com/org/fleet.git", "credential": "github"},
            "fallbackSource": {"url": "https://backup.example.com/fleet.git", "ref": "refs/heads/main"},
            "credentials": {"github": {"sshPrivateKey": KEY, "knownHosts": "github.com ssh-ed25519 AAAA"}}}
    assert stack(flux)[0].zones[0].flux.active.url.startswith("ssh://")
    flux["useFallbackSource"] = True
    assert stack(flux)[0].zones[0].flux.active.url == "https://backup.example.com/fleet.git"
    del flux["fallbackSource"]
    assert stack(flux)[1] == ["zones[0].flux.useFallbackSource: true needs zones[0].flux.fallbackSource"]


@pytest.mark.parametrize("flux, want", [
    ({"source": {"url": "fleet"}}, "zones[0].flux.source.url: must be a Git or OCI URL"),
    ({"source": {"url": "git@github.com:org/fleet.git"}}, "scp-like `user@host:path` is not accepted"),
    ({"source": {"url": "ftp://h/x"}}, "zones[0].flux.source.url: must be a Git or OCI URL"),
    ({"source": {"url": f"https://git:{TOKEN}@h/x"}}, "zones[0].flux.source.url: must not carry a password"),
    ({"source": {"url": "ssh://git@h/x"}}, "zones[0].flux.source.credential: required for an ssh:// URL"),
    ({"source": {"url": "ssh://git@h/x", "credential": "nope"}},
     "zones[0].flux.source.credential: no credential 'nope' in zones[0].flux.credentials (known: none)"),
    ({"source": {"url": "ssh://git@h/x", "credential": "t"}, "credentials": {"t": {"token": TOKEN}}},
     "zones[0].flux.source.credential: 't' has no sshPrivateKey, which an ssh:// URL needs"),
    ({"source": {"url": "https://h/x", "path": "clusters/../../etc"}},
     "zones[0].flux.source.path: must be a relative path inside the repository without `..`"),
    ({"source": {"url": "https://h/x", "path": "/abs"}}, "zones[0].flux.source.path: must be a relative path"),
    ({"source": {"url": "https://h/x"}, "fallbackSource": {"url": "https://b/x", "path": ".."}},
     "zones[0].flux.fallbackSource.path: must be a relative path"),
    ({"source": {"url": "https://h/x"}, "credentials": {"k": {"sshPrivateKey": KEY}}},
     "zones[0].flux.credentials.k.knownHosts: required with sshPrivateKey"),
    ({"source": {"url": "https://h/x"}, "credentials": {"k": {"knownHosts": "h ssh-ed25519 A"}}},
     "zones[0].flux.credentials.k: needs sshPrivateKey (+ knownHosts) or token"),
    ({"source": {"url": "https://h/x"}, "credentials": {"k": {"token": TOKEN}}, "retiredCredentials": ["k"]},
     "zones[0].flux.retiredCredentials[0]: 'k' is still in zones[0].flux.credentials"),
    ({"source": {"url": "https://h/x"}, "interval": "often"}, "zones[0].flux.interval: must be a Go duration"),
    ({"source": {"url": "https://h/x"}, "distribution": {"components": ["kube-proxy"]}},
     "zones[0].flux.distribution.components[0]: must be source-controller"),
    ({"source": {"url": "https://h/x"}, "sourcee": {}}, "zones[0].flux.sourcee: unknown key; did you mean source?"),
    ({}, "zones[0].flux.source: required"),
])
def test_bad_input_is_path_precise(flux, want):
    errs = stack(flux)[1]
    assert any(want in e for e in errs), errs


def test_a_key_that_is_not_a_pulumi_secret_is_refused_without_quoting_it():
    flux = {"source": {"url": "ssh://git@h/x", "credential": "k"},
            "credentials": {"k": {"sshPrivateKey": KEY, "knownHosts": "h ssh-ed25519 A"},
                            "t": {"token": TOKEN}}}
    errs = stack(flux, secret=frozenset())[1]
    assert [e.split(":")[0] for e in errs] == ["zones[0].flux.credentials.k.sshPrivateKey",
                                               "zones[0].flux.credentials.t.token"]
    assert "pulumi config set --secret --path 'kontinuum:zones[0].flux.credentials.k.sshPrivateKey'" in errs[0]
    assert stack(flux, secret=frozenset({"zones"}))[1] == []  # the engine marks the whole key secret
    # the offline check knows each secret path: a secure key and a plain token
    exact = frozenset({"zones[0].flux.credentials.k.sshPrivateKey"})
    assert [e.split(":")[0] for e in stack(flux, secret=exact)[1]] == ["zones[0].flux.credentials.t.token"]
    # wrong types are named without the value
    flux["credentials"]["t"]["token"] = ["not", TOKEN]
    errs = stack(flux)[1]
    assert errs == ["zones[0].flux.credentials.t.token: must be a string, got a value of another type",
                    "zones[0].flux.credentials.t: needs sshPrivateKey (+ knownHosts) or token"]
    assert all(TOKEN not in e and "BEGIN" not in e for e in errs)


def test_checker_reads_nested_secure_values(tmp_path):
    doc = {f"kontinuum:{k}": v for k, v in copy.deepcopy(FULL).items()}
    doc["kontinuum:zones"][0]["flux"] = {
        "source": {"url": "ssh://git@github.com/org/fleet.git", "credential": "github"},
        "credentials": {"github": {"sshPrivateKey": {"secure": "v1:abc"}, "knownHosts": "github.com ssh-ed25519 A"},
                        "gitea": {"token": TOKEN}}}
    import yaml

    path = tmp_path / "Pulumi.eu.yaml"
    path.write_text(yaml.safe_dump({"config": doc}))
    raw, secret = validation.read_stack_file(path)
    assert "zones[0].flux.credentials.github.sshPrivateKey" in secret
    out = subprocess.run([sys.executable, "-m", "kontinuum", "check", "--no-render", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "zones[0].flux.credentials.gitea.token: is plain text in the stack config" in out.stderr
    assert "github.sshPrivateKey" not in out.stderr and TOKEN not in out.stderr + out.stdout
