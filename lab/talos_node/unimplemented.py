"""Every method a node does not serve answers gRPC Unimplemented, as grpc-go does on a real node
("unknown method M for service S"), with a proper gRPC reply. grpclib's own answer to an unknown
path has no content-type, which Talos's Go clients report as a malformed, non-gRPC reply.
A method Talos does serve (authz.py lists it) is first refused to a configured node's caller
whose role may not call it, as machined's authz middleware does before any handler runs."""

from __future__ import annotations

from typing import Any

import grpclib.const
from google.protobuf import empty_pb2
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

from lab.talos_node import authz, tls


def _handler(path: str) -> grpclib.const.Handler:
    service, _, method = path.strip("/").rpartition("/")

    async def refuse(stream: Any) -> None:
        der = tls.peer_certificate(stream)  # None on a maintenance node: no client certificates there
        if der is not None and path in authz.RULES:
            identity = tls.client_identity(der)
            if not identity.client_auth_only or not authz.authorized(identity.roles, path):
                raise GRPCError(Status.PERMISSION_DENIED, "not authorized")
        raise GRPCError(Status.UNIMPLEMENTED, f"unknown method {method} for service {service}")

    # Empty parses any request (its fields stay unknown) and no reply is ever sent.
    return grpclib.const.Handler(refuse, Cardinality.UNARY_UNARY, empty_pb2.Empty, empty_pb2.Empty)


class Mapping(dict):
    """A grpclib method mapping (path → Handler) that serves unknown paths as Unimplemented."""

    def get(self, path: str, default: Any = None) -> grpclib.const.Handler:  # type: ignore[override]
        found = super().get(path, default)
        return found if found is not None else _handler(path)
