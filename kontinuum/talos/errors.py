"""Typed failures of Talos API calls.

Callers branch on the class (a maintenance call against a configured node is expected and
logged, "already bootstrapped" is success, a timeout is retried on the next `pulumi up`);
operators read the message, which names the node, the operation and what to do next.
"""

from __future__ import annotations

import asyncio
import errno
import ssl

from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from kontinuum.errors import KontinuumError


class TalosError(KontinuumError):
    """A Talos API call failed; `node` and `operation` say which one."""

    remedy = "Check the node and retry."

    def __init__(self, node: str, operation: str, problem: str, *, status: Status | None = None) -> None:
        self.node = node
        self.operation = operation
        self.problem = problem
        self.status = status
        super().__init__(f"{operation} on {node}: {problem}. {self.remedy}")


class NodeUnreachableError(TalosError):
    remedy = (
        "Check that the machine is powered on, booted into Talos and that TCP port 50000 is "
        "reachable from here; it may also be rebooting. If the machine is gone for good, mark it "
        "`lost: true` in its zone's talosAddresses (README: Lost machines)."
    )


class TalosTimeoutError(TalosError):
    remedy = (
        "The node may be rebooting, overloaded or behind a firewall that drops packets; retry, "
        "or raise the deadline (kontinuum.talos.client.Deadlines). If the machine is gone for good, mark it "
        "`lost: true` in its zone's talosAddresses (README: Lost machines)."
    )


class WrongModeError(TalosError):
    """The node does not serve this call in its current mode (gRPC Unimplemented)."""

    remedy = (
        "The node is in a different mode than this call needs: maintenance mode serves only "
        "apply-config and resource reads, a configured node needs its talosconfig (mTLS), and "
        "some calls exist only on control-plane nodes."
    )


class NotInMaintenanceError(WrongModeError):
    """A maintenance (insecure) call reached a node that already has a config."""

    remedy = (
        "The node has left maintenance mode and now requires a client certificate; talk to it "
        "with the cluster's talosconfig, or reset it to return it to maintenance mode."
    )


class PermissionDeniedError(TalosError):
    remedy = (
        "The client certificate's role does not allow this call (apply-config, bootstrap, "
        "kubeconfig, reset, upgrade and etcd changes need os:admin); use a talosconfig with an "
        "os:admin certificate issued by this cluster's OS CA."
    )


class ClientCertificateRejectedError(PermissionDeniedError):
    """The node ended the TLS session over our client certificate."""

    remedy = (
        "The node does not accept the talosconfig's client certificate: it is not signed by a "
        "CA the node trusts (machine.ca / machine.acceptedCAs) or has expired; use this "
        "cluster's talosconfig."
    )


class InvalidMachineConfigError(TalosError):
    remedy = "Fix the machine config (the node's validator message is above) and apply it again."


class NeedsRebootError(InvalidMachineConfigError):
    """A no-reboot (or try) apply that Talos refuses because the change needs a reboot. Talos's
    message carries a diff of the whole config, secrets included: only its first line is kept."""

    remedy = ("Talos applies this change only with a reboot. Let the zone's config rollout make it (it reboots one "
              "node at a time), or apply it in auto mode yourself.")


IMMEDIATE_REFUSAL = "can't be applied in immediate mode"


class AlreadyBootstrappedError(TalosError):
    """etcd already has data on this node: the cluster was bootstrapped before. Callers that
    want bootstrap to be idempotent treat this as success."""

    remedy = "Nothing to do: the cluster is already bootstrapped."


class ClusterUnhealthyError(TalosError):
    """The node's own health check did not pass within its wait timeout."""

    remedy = (
        "The cluster did not converge in time; the last progress message above names the "
        "check that was still failing. Fix that, or raise the wait timeout, and run again."
    )


class TlsTrustError(TalosError):
    """The TLS handshake failed: the node's certificate is not the one we trust or expect."""

    remedy = (
        "The node's certificate did not verify against the talosconfig's CA, or differs from "
        "the one pinned at first contact: another machine may answer at this address. Check "
        "the machine before trusting it."
    )


class TalosApiError(TalosError):
    """Any other gRPC failure; `status` holds the code."""


class FingerprintMismatchError(TlsTrustError):
    """A node in maintenance mode presented another certificate than the pinned one (the one
    discovery recorded): `pinned` and `seen` are SPKI SHA-256 fingerprints."""

    def __init__(self, node: str, operation: str, problem: str, *, pinned: str, seen: str) -> None:
        super().__init__(node, operation, problem)
        self.pinned, self.seen = pinned, seen


class CertificatePinMismatch(Exception):
    """Raised by the transport when a node's certificate differs from the pinned one;
    `classify` turns it into a FingerprintMismatchError naming the operation."""

    def __init__(self, message: str, *, pinned: str | None = None, seen: str | None = None) -> None:
        super().__init__(message)
        self.pinned, self.seen = pinned, seen


_BY_STATUS: dict[Status, type[TalosError]] = {
    Status.UNIMPLEMENTED: WrongModeError,
    Status.PERMISSION_DENIED: PermissionDeniedError,
    Status.UNAUTHENTICATED: PermissionDeniedError,
    Status.DEADLINE_EXCEEDED: TalosTimeoutError,
    Status.UNAVAILABLE: NodeUnreachableError,
}

_UNREACHABLE_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EHOSTDOWN,
    errno.ECONNABORTED,
    errno.EPIPE,
}


def from_status(node: str, operation: str, status: Status, message: str) -> TalosError:
    """Map a gRPC status (from the call or from a reply's metadata) to its typed error."""
    problem = f"{status.name}: {message}" if message else status.name
    if status is Status.INVALID_ARGUMENT and operation == "apply-config" and IMMEDIATE_REFUSAL in message:
        return NeedsRebootError(node, operation, f"{status.name}: {message.splitlines()[0]}", status=status)
    if status is Status.INVALID_ARGUMENT and operation == "apply-config":
        cls: type[TalosError] = InvalidMachineConfigError
    elif status is Status.ALREADY_EXISTS and operation == "bootstrap":
        cls = AlreadyBootstrappedError
    elif status is Status.DEADLINE_EXCEEDED and operation == "health-check":
        cls = ClusterUnhealthyError
    else:
        cls = _BY_STATUS.get(status, TalosApiError)
    return cls(node, operation, problem, status=status)


def classify(exc: BaseException, *, node: str, operation: str, timeout: float, maintenance: bool) -> TalosError:
    """Turn whatever the transport raised into one typed error."""
    if isinstance(exc, TalosError):
        return exc
    if isinstance(exc, CertificatePinMismatch):
        if exc.pinned and exc.seen:
            return FingerprintMismatchError(node, operation, str(exc), pinned=exc.pinned, seen=exc.seen)
        return TlsTrustError(node, operation, str(exc))
    if isinstance(exc, GRPCError):
        return from_status(node, operation, exc.status, exc.message or "")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return TalosTimeoutError(node, operation, f"no answer within {timeout:g} s")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TlsTrustError(node, operation, f"certificate verification failed ({getattr(exc, 'verify_message', None) or exc})")
    if isinstance(exc, ssl.SSLError):
        hint = "; a configured node rejects clients without a certificate" if maintenance else ""
        return TlsTrustError(node, operation, f"TLS failed ({exc.reason or exc}){hint}")
    if isinstance(exc, (StreamTerminatedError, ProtocolError)):
        hint = " (a configured node drops clients that present no certificate)" if maintenance else ""
        return NodeUnreachableError(node, operation, f"connection closed by the node{hint}")
    if isinstance(exc, OSError) and (exc.errno in _UNREACHABLE_ERRNOS or isinstance(exc, ConnectionError)):
        return NodeUnreachableError(node, operation, f"cannot connect ({exc.strerror or exc})")
    if isinstance(exc, OSError):
        return NodeUnreachableError(node, operation, f"network error ({exc})")
    return TalosApiError(node, operation, f"unexpected {type(exc).__name__}: {exc}")
