"""Prove an etcd snapshot restores: the real `etcdutl snapshot restore` into a scratch folder, a
real `etcd` started on it (loopback only, plain HTTP, its own ports), then read through etcd's
gRPC gateway: the revision must be the snapshot's, the store must hold keys, and the cluster's
own objects (the kube-system Namespace, the default Service) must read back as Kubernetes
objects. Everything is bounded by one deadline; etcd is stopped and the scratch folder (which
held the plaintext snapshot for etcdutl) removed whatever happens.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from kontinuum.backup.zone import BackupError

DEFAULT_TIMEOUT = 180.0
# What every Kubernetes cluster holds from its first minute (kube-apiserver creates them).
OWN_OBJECTS = ("/registry/namespaces/kube-system", "/registry/namespaces/default")
K8S_MAGIC = b"k8s\x00"  # kube-apiserver's protobuf envelope; JSON objects start with "{"


@dataclass(frozen=True)
class Proof:
    revision: int
    keys: int  # live keys after the restore
    stored_revisions: int  # etcdutl's totalKey: every stored revision of every key
    objects: tuple[str, ...]  # the cluster's own objects read back
    etcd_version: str
    seconds: float


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BackupError(f"{name} is not on PATH: verifying a backup restores it with the real etcd tools "
                          f"(install etcd and etcdutl of the zone's etcd version; in this repo "
                          "`PATH=$(tools/install.sh --print-bin):$PATH`)")
    return found


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _run(argv: list[str], deadline: float, what: str) -> str:
    left = deadline - time.monotonic()
    if left <= 0:
        raise BackupError(f"verify: out of time before {what}")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=left)
    except subprocess.TimeoutExpired:
        raise BackupError(f"verify: {what} did not finish in time") from None
    if done.returncode != 0:
        raise BackupError(f"verify: {what} failed: {(done.stderr or done.stdout).strip()[-600:]}")
    return done.stdout


def _gateway(url: str, path: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _wait_ready(url: str, proc: subprocess.Popen, deadline: float, log_file: Path) -> None:
    while True:
        try:
            _gateway(url, "/v3/kv/range", {"key": _b64("\0"), "count_only": True}, 2)
            return
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            raise BackupError(f"verify: the scratch etcd exited: {log_file.read_text()[-600:]}")
        if time.monotonic() > deadline:
            raise BackupError("verify: the scratch etcd did not answer in time")
        time.sleep(0.2)


def prove(chunks: Iterable[bytes], *, timeout: float = DEFAULT_TIMEOUT, address: str = "127.0.0.1") -> Proof:
    """Restore the snapshot given as plaintext chunks and read it back; raises BackupError naming
    what did not hold."""
    started = time.monotonic()
    deadline = started + timeout
    etcdutl, etcd = _binary("etcdutl"), _binary("etcd")
    scratch = Path(tempfile.mkdtemp(prefix="kontinuum-verify-"))
    proc = None
    try:
        plain = scratch / "snapshot.db"
        fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
        status = json.loads(_run([etcdutl, "snapshot", "status", str(plain), "-w", "json"], deadline,
                                 "etcdutl snapshot status"))
        client, peer = _free_port(address), _free_port(address)
        peer_url, client_url = f"http://{address}:{peer}", f"http://{address}:{client}"
        _run([etcdutl, "snapshot", "restore", str(plain), "--data-dir", str(scratch / "data"), "--name", "verify",
              "--initial-cluster", f"verify={peer_url}", "--initial-advertise-peer-urls", peer_url], deadline,
             "etcdutl snapshot restore")
        plain.unlink()
        version = _run([etcd, "--version"], deadline, "etcd --version").split("\n")[0].split()[-1]
        log_file = scratch / "etcd.log"
        with log_file.open("w") as log:
            proc = subprocess.Popen(
                [etcd, "--name", "verify", "--data-dir", str(scratch / "data"), "--listen-client-urls", client_url,
                 "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
                 "--initial-advertise-peer-urls", peer_url, "--listen-metrics-urls", "", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_ready(client_url, proc, deadline, log_file)
        left = max(1.0, deadline - time.monotonic())
        counted = _gateway(client_url, "/v3/kv/range", {"key": _b64("\0"), "range_end": _b64("\0"),
                                                        "count_only": True}, left)
        revision, keys = int(counted["header"]["revision"]), int(counted.get("count", 0))
        if revision != int(status["revision"]):
            raise BackupError(f"verify: the restored etcd is at revision {revision}, the snapshot says "
                              f"{status['revision']}")
        if keys == 0:
            raise BackupError("verify: the restored etcd holds no keys")
        found = []
        for key in OWN_OBJECTS:
            kvs = _gateway(client_url, "/v3/kv/range", {"key": _b64(key)}, left).get("kvs") or []
            value = base64.b64decode(kvs[0]["value"]) if kvs else b""
            if not (value.startswith(K8S_MAGIC) or value.startswith(b"{")):
                raise BackupError(f"verify: the cluster's own object {key} does not read back from the snapshot "
                                  "(not a Kubernetes cluster's etcd, or a damaged one)")
            found.append(key)
        return Proof(revision, keys, int(status.get("totalKey", 0)), tuple(found), version,
                     round(time.monotonic() - started, 1))
    except (OSError, ValueError, KeyError, urllib.error.URLError) as e:
        raise BackupError(f"verify: reading the scratch etcd failed: {e}") from None
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(scratch, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()
