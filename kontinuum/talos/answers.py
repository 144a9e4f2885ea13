"""What a Talos node answers, decoded: the typed results of TalosClient's calls and the checks
every reply needs (apid puts a node's failure inside a successful RPC)."""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass
from typing import Any, Iterable

import yaml
from grpclib.const import Status

from kontinuum.talos.errors import from_status


@dataclass(frozen=True)
class Link:
    name: str
    mac: str
    kind: str  # `type` in Talos's spec: ether, loopback, ...
    state: str  # operationalState: up, down, unknown
    mtu: int
    carrier: bool  # linkState


@dataclass(frozen=True)
class Address:
    link: str
    cidr: str
    family: str  # inet4 / inet6
    scope: str  # global, link, host


@dataclass(frozen=True)
class Discovery:
    """What a maintenance-mode node tells about itself."""

    address: str
    talos_version: str
    links: tuple[Link, ...]
    addresses: tuple[Address, ...]
    fingerprint: str | None  # SPKI SHA-256 of the node's maintenance certificate


@dataclass(frozen=True)
class ApplyResult:
    mode: str  # the mode the node actually used
    details: str
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class VersionInfo:
    tag: str
    sha: str
    arch: str
    platform: str
    rbac: bool


@dataclass(frozen=True)
class EtcdMember:
    id: int
    hostname: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    is_learner: bool


@dataclass(frozen=True)
class ServiceStatus:
    id: str
    state: str
    healthy: bool | None  # None while the service's health is unknown
    events: tuple[tuple[str, float], ...] = ()  # (state, node time in seconds) of its recent events, oldest first


def check_messages(messages: Iterable[Any], node: str, operation: str) -> None:
    """apid reports a per-node failure inside a successful RPC: check every message."""
    for message in messages:
        meta = message.metadata
        if meta.error:
            status = Status(meta.status.code) if meta.status.code else Status.UNKNOWN
            raise from_status(meta.hostname or node, operation, status, meta.error)


def yaml_spec(resource: Any) -> dict:
    spec = yaml.safe_load(resource.spec.yaml_spec or "{}")
    return spec if isinstance(spec, dict) else {}


def extract_kubeconfig(archive: bytes) -> str:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(archive)), mode="r:") as tar:
        for member in tar:
            if member.isfile():
                f = tar.extractfile(member)
                if f is not None:
                    return f.read().decode()
    raise ValueError("the kubeconfig archive holds no file")


def link_of(resource: Any) -> Link:
    spec = yaml_spec(resource)
    return Link(
        name=resource.metadata.id,
        mac=str(spec.get("hardwareAddr", "")),
        kind=str(spec.get("type", "")),
        state=str(spec.get("operationalState", "")),
        mtu=int(spec.get("mtu") or 0),
        carrier=bool(spec.get("linkState", False)),
    )

def address_of(resource: Any) -> Address:
    spec = yaml_spec(resource)
    return Address(
        link=str(spec.get("linkName", "")),
        cidr=str(spec.get("address", "")),
        family=str(spec.get("family", "")),
        scope=str(spec.get("scope", "")),
    )
