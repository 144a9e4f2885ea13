"""source-controller and kustomize-controller (lab stand-in): resolves each Flux GitRepository's
ref against its Git server and reports it the way source-controller does (Ready + artifact
revision); marks a Kustomization Ready for that revision when its `spec.path` exists in the
fetched tree (kustomize-controller's "kustomization path not found" otherwise). It applies
nothing from the repository: the lab has no workloads to run.

Flux's controllers run as kwok-played pods, which run nothing; this stand-in does the
observable part of source-controller for GitRepositories, and only in a namespace where a
source-controller pod is Ready (no controller, no status, as in reality). It really dials the
URL with `git ls-remote` (HTTP basic auth from the `secretRef`'s username/password, as Flux
reads it); an unreachable server, a refused credential or a missing ref is Ready=False with
git's own message. ssh:// URLs are refused: the lab serves Git over HTTP only.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from kubernetes import client

from lab.standins.loop import REQUEST_TIMEOUT, PollingStandin, api_client

GROUP, VERSION, PLURAL = "source.toolkit.fluxcd.io", "v1", "gitrepositories"
KS_GROUP, KS_PLURAL = "kustomize.toolkit.fluxcd.io", "kustomizations"
LS_REMOTE_TIMEOUT = 15.0
NOTE = "(lab stand-in for Flux's controllers)"


def ref_name(spec_ref: dict | None) -> str:
    ref = spec_ref or {}
    if ref.get("name"):
        return ref["name"]
    if ref.get("tag"):
        return f"refs/tags/{ref['tag']}"
    if ref.get("commit"):
        return ref["commit"]
    return f"refs/heads/{ref.get('branch') or 'master'}"


def with_auth(url: str, username: str | None, password: str | None) -> str:
    if not password:
        return url
    parts = urlsplit(url)
    netloc = f"{quote(username or 'git', safe='')}:{quote(password, safe='')}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))


def tree(url: str, sha: str, *, username: str | None = None, password: str | None = None) -> set[str]:
    """Every directory of the commit (a shallow, blob-less fetch into a scratch repo)."""
    import tempfile

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/nonexistent"}
    with tempfile.TemporaryDirectory(prefix="lab-flux-source-") as d:
        def git(*args):
            return subprocess.run(["git", *args], cwd=d, env=env, capture_output=True, text=True,
                                  timeout=LS_REMOTE_TIMEOUT, check=True).stdout
        git("init", "-q", "--bare")
        git("fetch", "-q", "--depth=1", "--filter=blob:none", with_auth(url, username, password), sha)
        files = git("ls-tree", "-r", "--name-only", "FETCH_HEAD").splitlines()
    dirs = {""}
    for f in files:
        parts = f.split("/")[:-1]
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return dirs


def resolve(url: str, ref: str, *, username: str | None = None, password: str | None = None) -> tuple[str | None, str]:
    """(revision `<ref>@sha1:<sha>` or None, message)."""
    if not url.startswith(("http://", "https://")):
        return None, f"{url}: the lab serves Git over HTTP only {NOTE}"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/nonexistent"}
    try:
        out = subprocess.run(["git", "ls-remote", with_auth(url, username, password)], capture_output=True, text=True,
                             timeout=LS_REMOTE_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        return None, f"failed to checkout and determine revision: {url}: timed out after {LS_REMOTE_TIMEOUT:g} s"
    if out.returncode != 0:
        why = out.stderr.strip().replace(password or "\0", "***").splitlines()
        return None, f"failed to checkout and determine revision: {why[-1] if why else 'git ls-remote failed'}"
    refs = dict(reversed(line.split("\t")) for line in out.stdout.splitlines() if "\t" in line)
    if ref in refs:
        return f"{ref}@sha1:{refs[ref]}", f"stored artifact for revision '{ref}@sha1:{refs[ref]}'"
    if len(ref) == 40 and ref in refs.values():
        return f"sha1:{ref}", f"stored artifact for revision 'sha1:{ref}'"
    return None, f"failed to checkout and determine revision: unable to resolve ref '{ref}'"


class GitSource(PollingStandin):
    """source-controller (lab stand-in) for one zone cluster."""

    name = "source-controller"

    def __init__(self, kubeconfig: str | Path, *, cluster: str, interval: float = 2.0):
        super().__init__(interval)
        self.cluster = cluster
        self.api = api_client(kubeconfig)
        self._trees: dict[tuple[str, str], set[str]] = {}  # (url, revision) -> directories
        self._sources: dict[tuple[str, str], tuple[str, set[str]]] = {}  # (ns, name) -> (revision, dirs)

    def close(self) -> None:
        self.api.close()

    def _controller_ready(self, core: client.CoreV1Api, namespace: str) -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector="app=source-controller",
                                        _request_timeout=REQUEST_TIMEOUT).items
        return any(not p.metadata.deletion_timestamp and any(c.type == "Ready" and c.status == "True"
                                                             for c in p.status.conditions or []) for p in pods)

    def _credentials(self, core: client.CoreV1Api, namespace: str, spec: dict) -> tuple[str | None, str | None]:
        name = (spec.get("secretRef") or {}).get("name")
        if not name:
            return None, None
        try:
            data = core.read_namespaced_secret(name, namespace, _request_timeout=REQUEST_TIMEOUT).data or {}
        except client.ApiException as e:
            if e.status == 404:
                return None, None
            raise
        value = lambda k: base64.b64decode(data[k]).decode() if k in data else None  # noqa: E731
        return value("username"), value("password")

    def poll(self) -> None:
        custom, core = client.CustomObjectsApi(self.api), client.CoreV1Api(self.api)
        try:
            repos = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=REQUEST_TIMEOUT)["items"]
        except client.ApiException as e:
            if e.status == 404:
                return  # Flux is not installed
            raise
        ready_in: dict[str, bool] = {}
        for repo in repos:
            md, spec = repo["metadata"], repo.get("spec") or {}
            ns = md["namespace"]
            if md.get("deletionTimestamp") or spec.get("suspend"):
                continue
            if ns not in ready_in:
                ready_in[ns] = self._controller_ready(core, ns)
            if not ready_in[ns]:
                continue
            user, password = self._credentials(core, ns, spec)
            revision, message = resolve(spec.get("url", ""), ref_name(spec.get("ref")), username=user,
                                        password=password)
            self._report(custom, repo, revision, message)
            if revision:
                key = (spec["url"], revision)
                if key not in self._trees:
                    self._trees[key] = tree(spec["url"], revision.rpartition(":")[2], username=user, password=password)
                self._sources[(ns, md["name"])] = (revision, self._trees[key])
        self._kustomizations(custom, ready_in)

    def _kustomizations(self, custom: client.CustomObjectsApi, ready_in: dict[str, bool]) -> None:
        try:
            items = custom.list_cluster_custom_object(KS_GROUP, VERSION, KS_PLURAL, _request_timeout=REQUEST_TIMEOUT)["items"]
        except client.ApiException as e:
            if e.status == 404:
                return
            raise
        for ks in items:
            md, spec = ks["metadata"], ks.get("spec") or {}
            ref = spec.get("sourceRef") or {}
            if md.get("deletionTimestamp") or spec.get("suspend") or ref.get("kind") != "GitRepository":
                continue
            source = self._sources.get((ref.get("namespace") or md["namespace"], ref.get("name")))
            if source is None:
                continue
            revision, dirs = source
            path = (spec.get("path") or "./").strip("/").removeprefix("./").rstrip("/")
            if path in ("", ".") or path in dirs:
                ok, message = True, f"Applied revision: {revision} {NOTE}"
            else:
                ok, message = False, f"kustomization path not found: stat /tmp/kustomization/{path}: no such file or directory"
            self._report(custom, ks, revision if ok else None, message, group=KS_GROUP, plural=KS_PLURAL,
                         fail_reason="ArtifactFailed", applied=revision if ok else None)

    def _report(self, custom: client.CustomObjectsApi, repo: dict, revision: str | None, message: str, *,
                group: str = GROUP, plural: str = PLURAL, fail_reason: str = "GitOperationFailed",
                applied: str | None = None) -> None:
        md, status = repo["metadata"], repo.get("status") or {}
        ready = {"type": "Ready", "status": "True" if revision else "False",
                 "reason": ("ReconciliationSucceeded" if applied else "Succeeded") if revision else fail_reason,
                 "message": message,
                 "observedGeneration": md.get("generation")}
        old = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
        if all(old.get(k) == v for k, v in ready.items()) and status.get("observedGeneration") == md.get("generation"):
            return
        from datetime import datetime, timezone

        ready["lastTransitionTime"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        new = {"observedGeneration": md.get("generation"), "conditions": [ready]}
        if applied:
            new["lastAppliedRevision"] = applied
            new["lastAttemptedRevision"] = applied
        elif revision:
            new["artifact"] = {"revision": revision, "path": f"gitrepository/{md['namespace']}/{md['name']}/lab.tar.gz",
                               "url": "http://source-controller.invalid/lab.tar.gz", "digest": "sha256:" + "0" * 64,
                               "lastUpdateTime": ready["lastTransitionTime"]}
        custom.patch_namespaced_custom_object_status(group, VERSION, md["namespace"], plural, md["name"],
                                                     {"status": new}, _request_timeout=REQUEST_TIMEOUT)
        self.log.info("%s %s/%s: %s", NOTE, md["namespace"], md["name"], message)
