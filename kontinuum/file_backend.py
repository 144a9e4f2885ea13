"""A file (diy) backend's state, read and repaired without the engine: what a killed engine
left, and whether a stack needs anything done before the next run (no engine start for it).

The backend stores each file with a sidecar `<file>.attrs` (JSON: content type, md5 of the
file). The data file is replaced atomically (temp file + rename); the sidecar is not: an engine
killed while checkpointing can leave it empty or describing the previous content, and every
later command then fails with "failed to load checkpoint: EOF" (measured, tests/e2e kill chain).
Locks live in `.pulumi/locks/<org>/<project>/<stack>/<id>.json` with the engine's pid and host.
A stack's checkpoint is `.pulumi/stacks/<project>/<stack>.json` in the project layout
(`.pulumi/meta.yaml` version 1): `{"version": 3, "checkpoint": {"latest": <deployment>}}`, whose
`latest` is what `pulumi stack export` prints as its deployment (pulumi v3.274.1 backend/diy).
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import yaml

# How the engine marks a secret value in a checkpoint: {SECRET_SIG: SECRET_VALUE, "ciphertext": …}.
SECRET_SIG, SECRET_VALUE = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"
ATTRIBUTES = {"user.cache_control": "", "user.content_disposition": "", "user.content_encoding": "",
              "user.content_language": "", "user.content_type": "text/plain; charset=utf-8",
              "user.metadata": None}


def is_secret(value) -> bool:
    return isinstance(value, dict) and value.get(SECRET_SIG) == SECRET_VALUE


def root(backend_url: str) -> Path | None:
    return Path(backend_url[len("file://"):]).expanduser() / ".pulumi" if backend_url.startswith("file://") else None


def lock_files(backend_url: str, project: str, stack: str) -> list[Path]:
    base = root(backend_url)
    return sorted((base / "locks").glob(f"*/{project}/{stack}/*.json")) if base else []


def engine_running(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(") ", 1)[-1].split()[0] != "Z" and bool(argv) and argv[0].endswith(b"pulumi")


def stale(lock: dict, hostname: str) -> bool:
    """A lock whose engine provably no longer runs: this host, pid gone (or not an engine now)."""
    return lock.get("hostname") == hostname and not engine_running(int(lock.get("pid") or 0))


def md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()  # noqa: S324 - the backend's own checksum


def repair_attributes(backend_url: str, project: str, stack: str) -> list[Path]:
    """Rewrite the sidecars of the stack's checkpoint files that do not describe their file;
    returns the sidecars rewritten. Call only when no engine holds the stack."""
    base = root(backend_url)
    if base is None:
        return []
    fixed = []
    for data_path in sorted((base / "stacks" / project).glob(f"{stack}.json*")):
        if data_path.suffix in (".attrs", ".tmp"):
            continue
        attrs_path = data_path.with_name(data_path.name + ".attrs")
        data = data_path.read_bytes()
        try:
            attrs = json.loads(attrs_path.read_text())
            if isinstance(attrs, dict) and attrs.get("md5") in (None, md5(data)):
                continue
        except (OSError, ValueError):
            attrs = {}
        attrs = {**ATTRIBUTES, **(attrs if isinstance(attrs, dict) else {}), "md5": md5(data)}
        attrs_path.write_text(json.dumps(attrs, separators=(",", ":")))
        fixed.append(attrs_path)
    return fixed


class NotReadable(Exception):
    """Only the engine can tell (another backend or layout, a compressed or older checkpoint)."""


def checkpoint(backend_url: str, project: str, stack: str) -> dict | None:
    """The stack's export (`{"version": 3, "deployment": ...}`) read from its checkpoint file, or
    None when the stack does not exist; NotReadable where only the engine can tell."""
    base = root(backend_url)
    if base is None or "/" in stack:
        raise NotReadable(backend_url)
    try:
        meta = yaml.safe_load((base / "meta.yaml").read_text())
    except (OSError, yaml.YAMLError):
        raise NotReadable("no readable .pulumi/meta.yaml") from None
    if not isinstance(meta, dict) or meta.get("version") != 1:
        raise NotReadable("not the project layout")
    path = base / "stacks" / project / f"{stack}.json"
    if any(path.with_name(path.name + ext).exists() for ext in (".gz", ".zst")):
        raise NotReadable("a compressed checkpoint")  # the engine picks the newest variant
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        raise NotReadable(f"{path.name} does not parse") from None
    if not isinstance(data, dict) or data.get("version") != 3 or not isinstance(data.get("checkpoint"), dict):
        raise NotReadable(f"{path.name} is not a version 3 checkpoint")
    return {"version": 3, "deployment": data["checkpoint"].get("latest")}
