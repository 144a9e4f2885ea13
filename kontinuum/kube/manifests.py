"""Kubernetes manifest bundles (the Gateway API CRDs) read in Python, not by the cluster.

Registering the objects one by one, parsed here, keeps `pulumi preview` and teardown free of
any call to the zone's API server (a provider-side YAML group loads the live schema even in
preview). A source is a local file, a directory of *.yaml files, or an http(s) URL; a URL is
fetched once, with a bound, and kept in a cache keyed by the URL (release bundles do not change).
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from kontinuum.errors import KontinuumError

FETCH_TIMEOUT = 30.0  # seconds for one download of a URL source
MAX_BYTES = 32 << 20


class ManifestError(KontinuumError):
    """A manifest source could not be read or holds something that is not a Kubernetes object."""


def cache_dir() -> Path:
    return Path(os.environ.get("KONTINUUM_CACHE", Path.home() / ".cache" / "kontinuum")) / "manifests"


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def parse(text: str, origin: str) -> list[dict]:
    """Every object of a multi-document YAML text; empty documents skipped, status dropped."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ManifestError(f"{origin}: not valid YAML{where}") from None
    objects = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind") \
                or not (doc.get("metadata") or {}).get("name"):
            raise ManifestError(f"{origin}: document {i + 1} is not a Kubernetes object "
                                "(apiVersion, kind and metadata.name are required)")
        objects.append({k: v for k, v in doc.items() if k != "status"})
    return objects


def _fetch(url: str, timeout: float) -> str:
    cached = cache_dir() / (hashlib.sha256(url.encode()).hexdigest()[:32] + ".yaml")
    if cached.is_file():
        return cached.read_text()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - http(s) only, checked above
            body = resp.read(MAX_BYTES + 1)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ManifestError(f"{url}: cannot download ({reason}); point the source at a local copy "
                            "or make the URL reachable from where Pulumi runs") from None
    if len(body) > MAX_BYTES:
        raise ManifestError(f"{url}: larger than {MAX_BYTES >> 20} MiB, not a manifest bundle")
    text = body.decode()
    parse(text, url)  # never cache what does not parse
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(cached)
    return text


def load(source: str, *, timeout: float = FETCH_TIMEOUT) -> list[dict]:
    """The objects of a bundle, in source order (directories: files sorted by name)."""
    if is_url(source):
        objects = parse(_fetch(source, timeout), source)
    else:
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
            if not files:
                raise ManifestError(f"{source}: a directory without *.yaml files")
        elif path.is_file():
            files = [path]
        else:
            raise ManifestError(f"{source}: no such file or directory")
        objects = [o for f in files for o in parse(f.read_text(), str(f))]
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    dupes = sorted({f"{k}/{n}" for k, n in names if names.count((k, n)) > 1})
    if dupes:
        raise ManifestError(f"{source}: the same object twice: {', '.join(dupes)}")
    return objects
