"""`python -m pip list -v --format json`, printed as pip 23 prints it, without pip's command
machinery: the pinned language host runs that command on every update only to find the
installed Pulumi packages (name, version, location) and their plugins, and pip spends ~0.9
CPU-s on it where importlib.metadata takes ~0.1 s. host-python (beside this file) runs this,
with the same interpreter and environment, for exactly those arguments and no others.

It follows pip's own rules (pip/_internal/commands/list.py and metadata/importlib): the
distributions found along sys.path as `python -m pip` sets it (without the working directory),
the first of each name winning, pip's skip list and name check, sorted by canonical name,
versions normalized by pip's own vendored `packaging`. What it does not model (eggs, .egg-link
files, direct_url.json, zip or wheel entries on sys.path, unusual metadata, another pip series or
metadata backend) is handed to the real pip, so the answer is pip's either way.
"""

import importlib.metadata
import json
import os
import re
import sys

ARGV = ["-m", "pip", "list", "-v", "--format", "json"]
PIP_SERIES = "23."  # the pip whose `list` this follows (the one Python 3.11's venv brings)
STDLIB_PKGS = {"python", "wsgiref", "argparse"}  # pip._internal.utils.compat.stdlib_pkgs
VALID_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)  # pip's, from PEP 508


class Unmodelled(Exception):
    """Something pip handles that this does not: the real pip answers."""


def installer(dist) -> str:
    try:
        text = dist.read_text("INSTALLER")
    except (OSError, ValueError):
        return ""
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def listing(path: list[str]) -> list[dict]:
    import pip
    import pip._vendor
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

    backend = os.environ.get("_PIP_USE_IMPORTLIB_METADATA")
    if (not pip.__version__.startswith(PIP_SERIES) or pip._vendor.DEBUNDLED or backend is not None
            or sys.version_info < (3, 11) or not getattr(importlib.metadata, "_PIP_USE_IMPORTLIB_METADATA", True)):
        raise Unmodelled("another pip or metadata backend")
    found, rows = set(), []
    for location in path:
        if os.path.isdir(location):
            with os.scandir(location) as entries:
                if any(e.name.endswith((".egg", ".egg-link")) for e in entries):
                    raise Unmodelled(f"an egg or egg link in {location}")
        elif os.path.exists(location):
            raise Unmodelled(f"a file on sys.path: {location}")  # a zip, wheel or egg
        for dist in importlib.metadata.distributions(path=[location]):
            info = getattr(dist, "_path", None)
            name = dist.name
            if info is None or not isinstance(name, str):
                raise Unmodelled(f"unusual metadata in {location}")
            if canonicalize_name(name) in found:
                continue  # shadowed by an earlier entry of sys.path
            found.add(canonicalize_name(name))
            if dist.read_text("direct_url.json") is not None:
                raise Unmodelled(f"{name} has a direct URL (maybe editable)")
            stem, suffix = os.path.splitext(info.name)
            canonical = canonicalize_name(stem.split("-", 1)[0] if suffix in (".dist-info", ".egg-info") else name)
            if not VALID_NAME.match(canonical) or canonical in STDLIB_PKGS:
                continue
            row = {"name": dist.metadata.get("Name", canonical), "version": str(Version(dist.version)),
                   "location": str(info.parent), "installer": installer(dist)}
            rows.append((canonical, row))
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


def main() -> None:
    if not sys.flags.safe_path:
        sys.path[0] = os.getcwd()  # where `-m` puts the working directory (this script's folder here)
    import pip  # noqa: F401 - found as `-m pip` finds it, before pip's __main__ edits sys.path

    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)  # pip's __main__ drops it
    try:
        rows = listing(list(sys.path))
    except Exception:  # noqa: BLE001 - anything unforeseen: pip itself answers
        os.execv(sys.executable, [sys.executable, *ARGV])
    sys.stdout.write(json.dumps(rows) + "\n")


if __name__ == "__main__":
    main()
