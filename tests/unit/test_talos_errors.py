"""How gRPC outcomes become typed Talos errors, including failures apid reports inside a
successful reply (messages[i].metadata.error), which only a `nodes` fan-out produces."""

from __future__ import annotations

import errno
import ssl

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from kontinuum.errors import KontinuumError
from kontinuum.talos import errors as e
from kontinuum.talos.answers import check_messages
from protos.gen.common import common_pb2
from protos.gen.machine import machine_pb2


@pytest.mark.parametrize(
    ("operation", "status", "expected"),
    [
        ("bootstrap", Status.ALREADY_EXISTS, e.AlreadyBootstrappedError),
        ("apply-config", Status.INVALID_ARGUMENT, e.InvalidMachineConfigError),
        ("health-check", Status.DEADLINE_EXCEEDED, e.ClusterUnhealthyError),
        ("version", Status.DEADLINE_EXCEEDED, e.TalosTimeoutError),
        ("version", Status.UNIMPLEMENTED, e.WrongModeError),
        ("reset", Status.PERMISSION_DENIED, e.PermissionDeniedError),
        ("reset", Status.UNAVAILABLE, e.NodeUnreachableError),
        ("upgrade", Status.INVALID_ARGUMENT, e.TalosApiError),
        ("version", Status.ALREADY_EXISTS, e.TalosApiError),
    ],
)
def test_status_mapping(operation: str, status: Status, expected: type) -> None:
    error = e.classify(GRPCError(status, "boom"), node="127.0.0.5", operation=operation, timeout=1, maintenance=False)
    assert type(error) is expected and isinstance(error, KontinuumError)
    assert str(error).startswith(f"{operation} on 127.0.0.5: {status.name}: boom. ")
    assert error.status is status


def test_transport_failures() -> None:
    def classify(exc: BaseException, maintenance: bool = False) -> e.TalosError:
        return e.classify(exc, node="n", operation="version", timeout=2.5, maintenance=maintenance)

    assert "within 2.5 s" in str(classify(TimeoutError()))
    assert isinstance(classify(ConnectionRefusedError(errno.ECONNREFUSED, "refused")), e.NodeUnreachableError)
    assert isinstance(classify(ssl.SSLCertVerificationError("bad")), e.TlsTrustError)
    assert "no certificate" in str(classify(StreamTerminatedError("Connection lost"), maintenance=True))
    assert isinstance(classify(e.CertificatePinMismatch("changed")), e.TlsTrustError)


def test_per_node_errors_inside_a_successful_reply() -> None:
    reply = machine_pb2.BootstrapResponse()
    reply.messages.add(metadata=common_pb2.Metadata(hostname="127.0.0.6"))
    check_messages(reply.messages, "127.0.0.5", "bootstrap")  # no error: nothing raised
    reply.messages.add(
        metadata=common_pb2.Metadata(
            hostname="127.0.0.7",
            error="etcd data directory is not empty",
            status=common_pb2.RpcStatus(code=Status.ALREADY_EXISTS.value, message="etcd data directory is not empty"),
        )
    )
    with pytest.raises(e.AlreadyBootstrappedError) as err:
        check_messages(reply.messages, "127.0.0.5", "bootstrap")
    assert err.value.node == "127.0.0.7"  # the node that failed, not the endpoint
    bare = machine_pb2.VersionResponse()
    bare.messages.add(metadata=common_pb2.Metadata(error="no status attached"))
    with pytest.raises(e.TalosApiError, match="UNKNOWN: no status attached"):
        check_messages(bare.messages, "127.0.0.5", "version")
