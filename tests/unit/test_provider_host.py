"""The dynamic-provider host (providers/host.py, started by tools/plugins/plugin_guard.py): our
own errors reach the engine as their message alone; a bug keeps its traceback (and
KONTINUUM_DEBUG=1 keeps every traceback). Driven over real gRPC, as the engine drives it."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import dill
import grpc
import pytest
from google.protobuf import struct_pb2
from pulumi.dynamic import CreateResult, ResourceProvider
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from kontinuum.errors import KontinuumError

ROOT = Path(__file__).parents[2]


class Unreachable(KontinuumError):
    pass


class ExpectedFailure(ResourceProvider):
    def create(self, props):
        raise Unreachable("zone eu-a: its cluster's API server did not answer within 60 s; set teardown…")


class Bug(ResourceProvider):
    def create(self, props):
        return CreateResult("x", {"v": {}["missing"]})


def _host(debug: bool = False):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("KONTINUUM_DEBUG", None)
    if debug:
        env["KONTINUUM_DEBUG"] = "1"
    guard = ROOT / "tools" / "plugins" / "plugin_guard.py"
    proc = subprocess.Popen([sys.executable, "-u", str(guard), str(os.getpid()), "dynamic"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port = proc.stdout.readline().strip()
    assert port.isdigit(), proc.stderr.read() if proc.poll() is not None else port
    return proc, port


def _create(port: str, provider: ResourceProvider) -> grpc.RpcError:
    props = struct_pb2.Struct()
    props.update({"__provider": base64.b64encode(dill.dumps(provider, recurse=True)).decode()})
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = provider_pb2_grpc.ResourceProviderStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Create(provider_pb2.CreateRequest(urn="urn:pulumi:s::p::t::n", properties=props), timeout=30)
    return e.value


@pytest.fixture
def host():
    started = []

    def start(**kw):
        proc, port = _host(**kw)
        started.append(proc)
        return port

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def test_our_errors_are_their_message_only(host):
    err = _create(host(), ExpectedFailure())
    assert err.details() == "zone eu-a: its cluster's API server did not answer within 60 s; set teardown…"


def test_a_bug_keeps_its_traceback(host):
    err = _create(host(), Bug())
    assert err.details().startswith("Traceback (most recent call last):") and "KeyError: 'missing'" in err.details()


def test_debug_mode_keeps_every_traceback(host):
    err = _create(host(debug=True), ExpectedFailure())
    assert err.details().startswith("Traceback (most recent call last):") and "Unreachable: zone eu-a" in err.details()
