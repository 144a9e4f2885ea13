"""The lab's real etcd snapshot and restore, as Talos does them for EtcdSnapshot and
Bootstrap(recover_etcd) (day-2 facts §3):

- snapshot: etcd's Maintenance.Snapshot through its gRPC gateway (POST /v3/maintenance/snapshot,
  newline-delimited JSON, base64 blobs); the last blob is etcd's sha256 of the database, so the
  bytes are exactly what clientv3's Snapshot() reader (and so Talos) streams;
- restore: `etcdutl snapshot restore` into a fresh data directory with this member alone as the
  initial cluster (the pinned etcdutl, tools/install.sh).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

RESTORE_TIMEOUT = 120.0  # seconds for etcdutl


class EtcdRestoreError(RuntimeError):
    pass


def snapshot(endpoint: str, ca_pem: bytes, client: tuple[str, str], *, timeout: float) -> bytes:
    """The snapshot of the etcd at `endpoint` (https, client-cert auth: `client` = (crt, key) files)."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    ctx.load_cert_chain(*client)
    request = urllib.request.Request(f"{endpoint}/v3/maintenance/snapshot", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    out = bytearray()
    with urllib.request.urlopen(request, context=ctx, timeout=timeout) as r:
        for line in r:
            if not line.strip():
                continue
            message = json.loads(line)
            if "error" in message:
                raise EtcdRestoreError(f"etcd snapshot: {message['error'].get('message', message['error'])}")
            out += base64.b64decode((message.get("result") or {}).get("blob", ""))
    return bytes(out)


def restore(snapshot_bytes: bytes, data_dir: Path, *, name: str, peer_url: str, workdir: Path,
            skip_hash_check: bool = False, env: dict | None = None) -> None:
    """A data directory for member `name` alone, from the snapshot; refuses a bad snapshot the
    way etcd does (hash mismatch, not a database), naming etcdutl's reason."""
    etcdutl = shutil.which("etcdutl", path=(env or os.environ).get("PATH"))
    if etcdutl is None:
        raise EtcdRestoreError("etcdutl is not on PATH (run `make tools`; tools/install.sh builds it)")
    workdir.mkdir(parents=True, exist_ok=True)
    snap = workdir / "etcd.snapshot"
    snap.write_bytes(snapshot_bytes)
    snap.chmod(0o600)
    argv = [etcdutl, "snapshot", "restore", str(snap), "--data-dir", str(data_dir), "--name", name,
            "--initial-cluster", f"{name}={peer_url}", "--initial-advertise-peer-urls", peer_url]
    if skip_hash_check:
        argv.append("--skip-hash-check")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=RESTORE_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        raise EtcdRestoreError(f"etcdutl snapshot restore did not finish within {RESTORE_TIMEOUT:g} s") from None
    finally:
        snap.unlink(missing_ok=True)  # Talos deletes the uploaded snapshot after the restore too
    if done.returncode != 0:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise EtcdRestoreError(f"etcdutl snapshot restore failed: {(done.stderr or done.stdout).strip()[-600:]}")
