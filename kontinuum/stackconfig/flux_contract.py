"""The `zones[].flux` part of the stack-config contract: the GitOps hand-off (seed 002).

Kept beside contract.py (which includes FLUX in the zone shape) because its formats and
defaults are Flux's own: the Flux Operator version pinned in tools/versions.env, the Flux
distribution that operator ships, the Secret layout Flux's source controllers read.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from kontinuum.stackconfig.schema import Bool, Format, List, Map, Obj, Str

# The Flux Operator release (tools/versions.env FLUX_OPERATOR_VERSION) and what it ships.
OPERATOR_VERSION = "v0.58.1"
DEFAULT_OPERATOR_CHART = {"repo": "oci://ghcr.io/controlplaneio-fluxcd/charts", "chart": "flux-operator",
                          "version": OPERATOR_VERSION.lstrip("v"), "namespace": "flux-system"}
DEFAULT_DISTRIBUTION_VERSION = "2.9.x"  # newest Flux the pinned operator embeds: v2.9.4
DEFAULT_REGISTRY = "ghcr.io/fluxcd"
DEFAULT_COMPONENTS = ("source-controller", "kustomize-controller", "helm-controller", "notification-controller")
COMPONENTS = (*DEFAULT_COMPONENTS, "image-reflector-controller", "image-automation-controller", "source-watcher")
DEFAULT_GIT_REF = "refs/heads/main"
DEFAULT_OCI_REF = "latest"
DEFAULT_INTERVAL = "1m"
DEFAULT_APPS = ("apps",)
PATH_DEFAULT_DOC = "`clusters/<region>/<zone>`"

_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
SCHEMES = ("ssh", "https", "http", "oci")


def source_kind(url: str) -> str:
    """GitRepository or OCIRepository, from the URL's scheme (the FluxInstance sync kind)."""
    return "OCIRepository" if url.startswith("oci://") else "GitRepository"


def _url_problem(value: str) -> str | None:
    want = "must be a Git or OCI URL: ssh://user@host/path, https://host/path or oci://registry/repository"
    if re.match(r"^[^/:@]+@[^/:]+:", value):  # scp-like git@host:org/repo
        return f"{want} (scp-like `user@host:path` is not accepted by Flux: write ssh://user@host/path)"
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return want
    if parts.scheme not in SCHEMES or not parts.hostname or parts.path in ("", "/"):
        return want
    if parts.password:
        return "must not carry a password or token: put it in flux.credentials as a secret"
    return None


def _path_problem(value: str) -> str | None:
    if value.startswith("/") or ".." in value.split("/"):
        return "must be a relative path inside the repository without `..`"
    return None


def _duration_problem(value: str) -> str | None:
    return None if _DURATION.match(value) else "must be a Go duration like 1m, 30s or 1h30m"


def _secret_name_problem(value: str) -> str | None:
    return None if _SECRET_NAME.match(value) and len(value) <= 253 else \
        "must be a Kubernetes Secret name: lowercase letters, digits, '-' and '.'"


SOURCE_URL = Format("Git/OCI URL", _url_problem, r"^(ssh|https?|oci)://[^/]+/.+")
REPO_PATH = Format("repository path", _path_problem, r"^(?!/)(?!.*(^|/)\.\.(/|$)).*$")
DURATION = Format("duration", _duration_problem, _DURATION.pattern)
SECRET_NAME = Format("Secret name", _secret_name_problem, _SECRET_NAME.pattern)


def _source(doc: str, *, required: bool = False):
    return Obj({
        "url": Str("`ssh://`, `https://` (Git) or `oci://` (OCI artifact) URL", required=True, format=SOURCE_URL),
        "ref": Str("Git ref (`refs/heads/<branch>`, `refs/tags/<tag>` or a commit SHA) or OCI tag",
                   doc_default=f"`{DEFAULT_GIT_REF}` (Git), `{DEFAULT_OCI_REF}` (OCI)"),
        "path": Str("directory in the source that the sync applies", format=REPO_PATH, doc_default=PATH_DEFAULT_DOC),
        "credential": Str("name of an entry of `flux.credentials` used to read it (required for an ssh:// URL)",
                          format=SECRET_NAME),
    }, doc, required=required)


CREDENTIAL = Obj({
    "sshPrivateKey": Str("**secret**: the deploy key (PEM/OpenSSH private key) for ssh:// sources", secret=True),
    "knownHosts": Str("the SSH host keys of the Git server (`ssh-keyscan` output); required with sshPrivateKey"),
    "username": Str("HTTPS or registry user name (default `git`)"),
    "token": Str("**secret**: HTTPS access token (Git) or registry token (OCI)", secret=True),
}, "one credential; stored as the Secret `<name>` in the operator's namespace, in the layout Flux reads "
   "(`identity` + `known_hosts`; `username` + `password`; or a docker config for OCI)", expand=False)

FLUX = Obj({
    "source": _source("where the zone syncs from", required=True),
    "fallbackSource": _source("a second, read-only source (e.g. a Git backup) the zone can be switched to by "
                              "config alone during an outage of `source`"),
    "useFallbackSource": Bool("sync from `fallbackSource` instead of `source` (and back when false); only the "
                              "FluxInstance's source changes", default=False),
    "interval": Str("how often the source is fetched", default=DEFAULT_INTERVAL, format=DURATION),
    "credentials": Map(CREDENTIAL, "named credentials, each with `sshPrivateKey` + `knownHosts` or `token` "
                       "(+ `username`); secret values must be Pulumi secrets "
                       "(`pulumi config set --secret --path 'kontinuum:zones[0].flux.credentials.github.sshPrivateKey'`). "
                       "Removing one deletes its Secret"),
    "retiredCredentials": List(Str(format=SECRET_NAME),
                               "names of credential Secrets in the operator's namespace that this stack does not "
                               "manage (e.g. left by an earlier bootstrap, the seed's Gitea key) and that `pulumi up` "
                               "deletes; only those, never one still named in `credentials`"),
    "handOver": Bool("Git owns Flux after its bootstrap (seed 002's run-once mode): once the FluxInstance is Ready, "
                     "`pulumi up` no longer changes it nor reports it as drift, and removing `flux` from the zone then "
                     "forgets the bootstrap objects without uninstalling Flux (namespace, operator release, FluxInstance "
                     "and credential Secrets stay). See README, GitOps hand-off", default=False),
    "suspendApps": Bool("start with the application Kustomizations suspended, the infrastructure reconciled "
                        "(a rebuild); false resumes them. See README, GitOps hand-off", default=False),
    "apps": List(Str(format=SECRET_NAME), "names of the application Kustomizations (in the operator's namespace) "
                 "that `suspendApps` suspends", default=list(DEFAULT_APPS), doc_default="`[apps]`"),
    "distribution": Obj({
        "version": Str("Flux version or semver range (the pinned operator ships v2.2–v2.9)",
                       default=DEFAULT_DISTRIBUTION_VERSION),
        "registry": Str("registry of the Flux controller images", default=DEFAULT_REGISTRY),
        "components": List(Str(enum=COMPONENTS), "Flux controllers to install", default=list(DEFAULT_COMPONENTS),
                           doc_default="source-, kustomize-, helm-, notification-controller"),
    }, "the Flux distribution the operator installs"),
    "operatorChart": Obj({
        "repo": Str("Helm repository (an `oci://` registry) of the chart"),
        "chart": Str("chart name"),
        "version": Str("chart version"),
        "path": Str("a local chart directory instead (the lab's minimal chart)"),
        "namespace": Str("namespace of the operator, its FluxInstance and the credential Secrets",
                         default=DEFAULT_OPERATOR_CHART["namespace"]),
    }, f"the Flux Operator chart; default `{DEFAULT_OPERATOR_CHART['repo']}/flux-operator` "
       f"{DEFAULT_OPERATOR_CHART['version']}", expand=False),
}, "hand the zone to Flux (seed 002): the Flux Operator on the host network through KubePrism, installed right "
   "after Cilium, then the FluxInstance `flux` syncing `source`. Absent: no Flux; removed: uninstalled (kept running "
   "with `handOver`)")
