"""What the Talos providers share: input checks that let preview's unknowns through, the
authenticated client built from a talosconfig input, and log lines that reach the Pulumi CLI.

Everything here is pure except `node_client`'s callers; checks parse but never dial.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sys
from typing import TYPE_CHECKING, Any, Callable

import pulumi
from pulumi.output import Unknown
from pulumi.dynamic import CheckFailure, CheckResult
from pulumi.runtime import rpc, settings

from kontinuum.errors import ConfigError
from kontinuum.talos import talosconfig
from kontinuum.talos.errors import NodeUnreachableError, TalosError, TalosTimeoutError, TlsTrustError
from kontinuum.talos.talosconfig import APID_PORT

if TYPE_CHECKING:  # the client (grpclib, protobuf) loads where one is made: the program and diffs never need it
    from kontinuum.talos.client import TalosClient

_log = logging.getLogger("kontinuum.providers.talos")

# Failures a node shows while it reboots into a new identity; waits retry them.
TRANSIENT = (NodeUnreachableError, TalosTimeoutError, TlsTrustError)


def _under_engine() -> bool:
    """True in the Pulumi program and in the dynamic-provider host (`python -m
    pulumi.dynamic`), whose stderr the engine shows; False when tests call a provider."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return settings.get_engine() is not None or (spec is not None and (spec.name or "").startswith("pulumi.dynamic"))


def info(message: str) -> None:
    if _under_engine():
        pulumi.log.info(message)
    else:
        _log.info(message)


def warn(message: str) -> None:
    if _under_engine():
        pulumi.log.warn(message)
    else:
        _log.warning(message)


def known(value: Any) -> bool:
    """False for a value preview cannot know yet (or a list holding one). The engine sends an
    unknown as the UNKNOWN sentinel, or as an output value that the SDK turns into an Unknown
    (or an Output) object."""
    if isinstance(value, list):
        return all(known(v) for v in value)
    return value != rpc.UNKNOWN and not isinstance(value, (pulumi.Output, Unknown))


def config_hash(config: str) -> str:
    return hashlib.sha256(config.encode()).hexdigest()


def node_client(props: dict, address: str | None = None) -> TalosClient:
    """mTLS client for exactly the node at `address` (default: props["address"]), reached
    directly, so a call never gets proxied to another member."""
    from kontinuum.talos.client import TalosClient

    address = address or props["address"]
    config = talosconfig.parse(props["talosconfig"])
    return TalosClient.from_talosconfig(
        config, node=address, endpoint=address, port=int(props.get("talosPort") or APID_PORT)
    )


def maintenance_client(props: dict, fingerprint: str | None = None) -> TalosClient:
    from kontinuum.talos.client import TalosClient

    return TalosClient.maintenance(props["address"], port=int(props.get("talosPort") or APID_PORT),
                                   fingerprint=fingerprint)


def machine_inventory(props: dict):
    """The hub's Instances, when this machine has one (imported here: only the provider
    process needs the kubernetes client)."""
    if not (props.get("hubKubeconfig") and props.get("instance")):
        return None
    from kontinuum.hub.inventory import Inventory

    return Inventory.from_kubeconfig(props["hubKubeconfig"])


KUBECONFIG_TRY = 10.0  # seconds to get the admin kubeconfig from one control plane


def cluster_kubeconfig(props: dict, first: str | None = None) -> str | None:
    """The cluster's admin kubeconfig through a control plane's Talos API (Kubeconfig RPC):
    `first`, then the control planes the talosconfig names; None when none hands one out."""
    endpoints = talosconfig.parse(props["talosconfig"]).endpoints
    for cp in ([first] if first else []) + [e for e in endpoints if e != first]:
        try:
            return node_client(props, cp).kubeconfig(timeout=KUBECONFIG_TRY)
        except TalosError:
            continue
    return None


def client_cache(props: dict) -> Callable[[str], TalosClient]:
    """node_client per address, made once and reused for a whole step (one TLS context per node,
    not per call)."""
    clients: dict[str, TalosClient] = {}

    def client_for(address: str) -> TalosClient:
        if address not in clients:
            clients[address] = node_client(props, address)
        return clients[address]

    return client_for


def kubeconfig_getter(props: dict) -> Callable[[], str | None]:
    """cluster_kubeconfig, fetched once and reused (a readiness wait asks many times); asked
    again while no control plane hands one out."""
    found: list[str] = []

    def get() -> str | None:
        if not found and (kubeconfig := cluster_kubeconfig(props)) is not None:
            found.append(kubeconfig)
        return found[0] if found else None

    return get


class Inputs:
    """Validates and normalises a check's `news`: fills defaults, turns the engine's floats
    into ints where needed, collects failures. Unknown values are left for the real run."""

    def __init__(self, news: dict) -> None:
        self.news = dict(news)
        self.failures: list[CheckFailure] = []

    def fail(self, prop: str, reason: str) -> None:
        self.failures.append(CheckFailure(prop, reason))

    def _get(self, prop: str, default: Any = None) -> tuple[bool, Any]:
        value = self.news.get(prop)
        if value is None:
            value = default
            if default is not None:
                self.news[prop] = default
        return known(value), value

    def string(self, prop: str, what: str, *, choices: tuple[str, ...] = ()) -> None:
        ok, value = self._get(prop)
        if not ok:
            return
        if not isinstance(value, str) or not value:
            self.fail(prop, f"required: {what}")
        elif choices and value not in choices:
            self.fail(prop, f"must be one of {', '.join(choices)}, got {value!r}")

    def secret_text(self, prop: str, what: str) -> str | None:
        """A required secret string; the returned value is for further pure checks only and
        never goes into a message."""
        ok, value = self._get(prop)
        if not ok:
            return None
        if not isinstance(value, str) or not value.strip():
            self.fail(prop, f"required: {what} (secret)")
            return None
        return value

    def strings(self, prop: str, what: str) -> None:
        ok, value = self._get(prop)
        if ok and (not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value)):
            self.fail(prop, f"must be a non-empty list of {what}")

    def optional_strings(self, prop: str, what: str) -> None:
        ok, value = self._get(prop, [])
        if ok and (not isinstance(value, list) or not all(isinstance(v, str) and v for v in value)):
            self.fail(prop, f"must be a list of {what}")

    def port(self, prop: str = "talosPort") -> None:
        ok, value = self._get(prop, APID_PORT)
        if not ok:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or not 0 < value < 65536:
            self.fail(prop, f"must be a TCP port (1-65535), got {value!r}")
        else:
            self.news[prop] = int(value)

    def seconds(self, prop: str, default: float) -> None:
        ok, value = self._get(prop, default)
        if not ok:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            self.fail(prop, f"must be a number of seconds > 0, got {value!r}")

    def flag(self, prop: str, default: bool | None) -> None:
        ok, value = self._get(prop, default)
        if ok and value is not None and not isinstance(value, bool):
            self.fail(prop, f"must be true or false, got {value!r}")

    def talosconfig(self, prop: str = "talosconfig") -> None:
        text = self.secret_text(prop, "the cluster's talosconfig")
        if text is None:
            return
        try:
            config = talosconfig.parse(text)
        except ConfigError as exc:  # names a path inside the file, never a value
            self.fail(prop, f"not a usable talosconfig: {exc}")
            return
        if not (config.ca and config.crt and config.key):
            self.fail(prop, f"context {config.context!r} needs ca, crt and key for an authenticated connection")

    def result(self) -> CheckResult:
        return CheckResult(self.news, self.failures)
