"""A real S3-compatible server for the shared-state tests: SeaweedFS (`weed mini`, pinned in
tools/versions.env) on one loopback address, one bucket, one access key, nothing else
(no WebDAV, no admin UI, no telemetry). It stops by itself after `ttl` seconds and is stopped
when the context ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

S3_PORT = 8333
START_TIMEOUT = 90.0  # seconds for the gateway to accept connections (a loaded machine)


@dataclass(frozen=True)
class S3Server:
    address: str
    bucket: str
    access_key: str
    secret_key: str

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{S3_PORT}"

    def backend_url(self, prefix: str = "") -> str:
        """Pulumi's DIY `s3://` backend URL for this server (gocloud.dev s3blob parameters)."""
        path = f"/{prefix.strip('/')}" if prefix else ""
        return f"s3://{self.bucket}{path}?endpoint={self.endpoint}&use_path_style=true&region=us-east-1"

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_EC2_METADATA_DISABLED": "true"}


def _private_ports(address: str) -> list[str]:
    """`weed mini` names its unix sockets after its gRPC ports, all in /tmp
    (`/tmp/seaweedfs-master-grpc-19333.sock`), and binds its admin server on 127.0.0.1: two servers
    with default ports share those sockets, and the first to stop removes the other's, which then
    answers every write with 500 InternalError. Ports derived from the address keep each server's
    own (below the ephemeral range)."""
    third, fourth = (int(part) for part in address.split(".")[2:])
    base = 10000 + ((third * 256 + fourth) % 3500) * 6
    names = ("master.port.grpc", "volume.port.grpc", "filer.port.grpc", "s3.port.grpc", "admin.port",
             "admin.port.grpc")
    return [f"-{name}={base + i}" for i, name in enumerate(names)] + ["-admin.port.legacy=0"]


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def _wait_for_bucket(server: S3Server, proc: subprocess.Popen, deadline: float, log: Path) -> None:
    """weed mini creates `-bucket` shortly after its S3 port opens: wait until the bucket answers."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id=server.access_key,
                      aws_secret_access_key=server.secret_key,
                      config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1},
                                    s3={"addressing_style": "path"}))
    while True:
        try:
            s3.head_bucket(Bucket=server.bucket)
            return
        except (BotoCoreError, ClientError):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not create bucket {server.bucket}: {log.read_text()[-2000:]}")
            time.sleep(0.3)


@contextmanager
def running_s3(state: Path, *, address: str, bucket: str = "kontinuum-state", ttl: float = 1800):
    weed = shutil.which("weed")
    if weed is None:
        raise RuntimeError("weed is not on PATH: run `tools/install.sh weed` (make tools)")
    state.mkdir(parents=True, exist_ok=True)
    server = S3Server(address, bucket, "kontinuum-ci", os.urandom(16).hex())
    config = state / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "ci", "credentials": [{"accessKey": server.access_key, "secretKey": server.secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    config.chmod(0o600)
    argv = ["timeout", "-s", "KILL", str(int(ttl)), weed, "mini", f"-dir={state / 'data'}", f"-ip={address}",
            f"-ip.bind={address}", f"-bucket={bucket}", f"-s3.config={config}", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false",
            f"-filer.localSocket={state / 'filer.sock'}", f"-s3.localFilerSocket={state / 'filer.sock'}",
            f"-s3.localSocket={state / 's3.sock'}",
            *_private_ports(address)]
    (state / "data").mkdir(exist_ok=True)
    log = (state / "weed.log").open("w")
    # weed adds an admin identity from AWS_* variables: the caller's (another server's key) would
    # shadow this server's own identity of the same name.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(address, S3_PORT):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not serve S3 on {address}:{S3_PORT}: "
                                   f"{(state / 'weed.log').read_text()[-2000:]}")
            time.sleep(0.5)
        _wait_for_bucket(server, proc, deadline, state / "weed.log")
        yield server
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        log.close()
