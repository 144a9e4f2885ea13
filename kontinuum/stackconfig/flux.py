"""Typed `zones[].flux` config and its cross-field checks (the shapes are in flux_contract.py).

Secret values (deploy keys, tokens) must be Pulumi secrets. The engine tells the program only
which top-level keys hold a secret (a `--secret --path` value makes its whole key secret), the
offline check (`python -m kontinuum check`) knows each secret path; `is_secret(path)` answers
for either. No message here ever quotes a secret value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from kontinuum.stackconfig import flux_contract as fc
from kontinuum.stackconfig.schema import Field

Report = Callable[[str, str], None]


@dataclass(frozen=True)
class Source:
    url: str
    ref: str
    path: str
    credential: str | None

    @property
    def kind(self) -> str:
        return fc.source_kind(self.url)


@dataclass(frozen=True)
class Credential:
    name: str
    ssh_private_key: str | None = field(default=None, repr=False)
    known_hosts: str | None = None
    username: str | None = None
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Flux:
    source: Source
    fallback: Source | None
    use_fallback: bool
    interval: str
    credentials: tuple[Credential, ...]
    retired: tuple[str, ...]
    suspend_apps: bool
    apps: tuple[str, ...]
    hand_over: bool
    version: str
    registry: str
    components: tuple[str, ...]
    chart: dict  # repo/chart/version or path, and namespace

    @property
    def active(self) -> Source:
        return self.fallback if self.use_fallback and self.fallback else self.source

    @property
    def namespace(self) -> str:
        return self.chart["namespace"]


def secret_paths(f: Field, value: Any, path: str) -> Iterator[str]:
    """Paths of every value in `value` whose contract field is marked secret."""
    if value is None:
        return
    if f.secret:
        yield path
    if f.fields is not None and isinstance(value, dict):
        for k, sub in f.fields.items():
            if k in value:
                yield from secret_paths(sub, value[k], f"{path}.{k}")
    elif f.values is not None and isinstance(value, dict):
        for k, v in value.items():
            yield from secret_paths(f.values, v, f"{path}.{k}")
    elif f.items is not None and isinstance(value, list):
        for i, v in enumerate(value):
            yield from secret_paths(f.items, v, f"{path}[{i}]")


def is_secret(path: str, secret: frozenset[str]) -> bool:
    """True when `path` or an enclosing key (e.g. `zones`, set whole by the engine) is secret."""
    return any(path == s or path.startswith((f"{s}.", f"{s}[")) for s in secret)


def _source(raw: dict | None, region: str, zone: str) -> Source | None:
    if not raw or "url" not in raw:
        return None
    kind = fc.source_kind(raw["url"])
    ref = raw.get("ref") or (fc.DEFAULT_OCI_REF if kind == "OCIRepository" else fc.DEFAULT_GIT_REF)
    return Source(raw["url"], ref, raw.get("path") or f"clusters/{region}/{zone}", raw.get("credential"))


def parse(raw: dict, path: str, region: str, zone: str, report: Report) -> Flux | None:
    """The typed flux config of one (schema-checked, defaults-merged) zone; problems reported."""
    source = _source(raw.get("source"), region, zone)
    if source is None:
        return None  # reported by the schema check
    fallback = _source(raw.get("fallbackSource"), region, zone)
    creds = {}
    for name, c in (raw.get("credentials") or {}).items():
        p = f"{path}.credentials.{name}"
        problem = fc.SECRET_NAME.problem(name)
        if problem:
            report(p, f"credential name {problem}")
        if c.get("sshPrivateKey") and c.get("token"):
            report(p, "give sshPrivateKey (+ knownHosts) or token, not both")
        elif not c.get("sshPrivateKey") and not c.get("token"):
            report(p, "needs sshPrivateKey (+ knownHosts) or token")
        elif c.get("sshPrivateKey") and not c.get("knownHosts"):
            report(f"{p}.knownHosts", "required with sshPrivateKey (the Git server's host keys, `ssh-keyscan <host>`)")
        creds[name] = Credential(name, c.get("sshPrivateKey"), c.get("knownHosts"), c.get("username"), c.get("token"))
    for key, src in (("source", source), ("fallbackSource", fallback)):
        if src is None:
            continue
        p = f"{path}.{key}"
        cred = creds.get(src.credential) if src.credential else None
        if src.credential and cred is None:
            known = ", ".join(sorted(creds)) or "none"
            report(f"{p}.credential", f"no credential {src.credential!r} in {path}.credentials (known: {known})")
        if src.url.startswith("ssh://") and (cred is None or not cred.ssh_private_key):
            if not src.credential:
                report(f"{p}.credential", "required for an ssh:// URL: name an entry of "
                       f"{path}.credentials with sshPrivateKey and knownHosts")
            elif cred is not None:
                report(f"{p}.credential", f"{src.credential!r} has no sshPrivateKey, which an ssh:// URL needs")
        if cred is not None and cred.ssh_private_key and not src.url.startswith("ssh://"):
            report(f"{p}.credential", f"{src.credential!r} is an SSH key; {key}.url is not ssh://")
    retired = tuple(raw.get("retiredCredentials") or ())
    for i, name in enumerate(retired):
        if name in creds:
            report(f"{path}.retiredCredentials[{i}]", f"{name!r} is still in {path}.credentials: remove it there "
                   "first (that alone deletes its Secret) or drop it from retiredCredentials")
    if raw.get("useFallbackSource") and fallback is None:
        report(f"{path}.useFallbackSource", f"true needs {path}.fallbackSource")
    dist = raw.get("distribution") or {}
    chart = dict(raw.get("operatorChart") or {})
    if chart.get("path"):
        chart = {"path": chart["path"], "namespace": chart.get("namespace", fc.DEFAULT_OPERATOR_CHART["namespace"])}
    else:
        chart = {**fc.DEFAULT_OPERATOR_CHART, **chart}
    return Flux(
        source=source, fallback=fallback, use_fallback=bool(raw.get("useFallbackSource")),
        interval=raw.get("interval", fc.DEFAULT_INTERVAL), credentials=tuple(creds.values()), retired=retired,
        suspend_apps=bool(raw.get("suspendApps")), apps=tuple(raw.get("apps", fc.DEFAULT_APPS)),
        hand_over=bool(raw.get("handOver")),
        version=dist.get("version", fc.DEFAULT_DISTRIBUTION_VERSION),
        registry=dist.get("registry", fc.DEFAULT_REGISTRY),
        components=tuple(dist.get("components", fc.DEFAULT_COMPONENTS)), chart=chart,
    )
