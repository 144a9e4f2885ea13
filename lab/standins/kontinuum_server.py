"""kontinuum-server (lab stand-in): registers one zone's server in the hub and heartbeats.

The real server runs in the zone's `kontinuum` Deployment and reaches the hub through a relay
that signs every call with the zone's identity key; the hub accepts it only if that key
matches the public certificate it holds for the zone. kwok-played pods run nothing, so this
stand-in does the observable part: once the Deployment is Available, it reads the key the
footprint delivered, checks it against the hub's certificate, and only on a match upserts the
Kontinuum `<region>-<zone>` and refreshes its status.heartbeat every few seconds. A wrong or
missing key means no heartbeat; the reason is logged, kept in `state`, and recorded as a
Warning Event on the zone Deployment, where an operator of a real zone would look.
"""

from __future__ import annotations

import base64
import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from kubernetes import client

from kontinuum.hub import crds as hub
from kontinuum.kube import watching
from kontinuum.talos import pki
from lab.standins.loop import REQUEST_TIMEOUT, STANDIN_ANNOTATION, PollingStandin, api_client

HEARTBEAT_INTERVAL = 5.0  # seconds between heartbeats
REJECTED_REASON = "IdentityRejected"
EVENT_SOURCE = "kontinuum-server (lab stand-in)"
STANDIN_NOTE = "registered by the lab kontinuum-server stand-in (lab stand-in)"


# -- pure: does the delivered key belong to the hub's certificate? ------------------------


def _spki(public_key) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_matches_certificate(key_pem: bytes, cert_pem: bytes) -> bool:
    """True if the private key's public half is the certificate's public key. Raises on bad PEM."""
    return _spki(pki.load_private_key(key_pem).public_key()) == _spki(pki.load_certificate(cert_pem).public_key())


def identity_problem(key_pem: bytes | None, cert_pem: bytes | None, *, key_at: str, cert_at: str) -> str | None:
    """Why the hub would reject this zone's identity, or None if it would accept it."""
    if not key_pem:
        return f"no identity key: {key_at} is missing or has no tls.key"
    if not cert_pem:
        return f"the hub holds no certificate for this zone: {cert_at} is missing or has no {hub.HUB_IDENTITY_CERT_KEY}"
    try:
        key = pki.load_private_key(key_pem)
    except (ValueError, TypeError) as e:
        return f"identity key in {key_at} is not a readable PEM private key ({e})"
    try:
        cert = pki.load_certificate(cert_pem)
    except ValueError as e:
        return f"the hub's certificate {cert_at} is not a readable PEM certificate ({e})"
    if _spki(key.public_key()) != _spki(cert.public_key()):
        return f"identity key in {key_at} does not match the hub's certificate {cert_at}"
    return None


# -- the loop -------------------------------------------------------------------------------


def _named(api: type, method: str, namespace: str, name: str) -> watching.Source:
    return watching.Source(api, method, (namespace,), {"field_selector": f"metadata.name={name}"})


@dataclass(frozen=True)
class State:
    """What the stand-in last observed: waiting, rejected or heartbeating, and why."""

    phase: str
    message: str
    heartbeat: dt.datetime | None = None


def _now_rfc3339() -> str:
    return pki.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")


def _secret_value(secret: client.V1Secret | None, key: str) -> bytes | None:
    raw = (secret.data or {}).get(key) if secret is not None else None
    return base64.b64decode(raw) if raw else None


class KontinuumServer(PollingStandin):
    """kontinuum-server (lab stand-in) for one zone."""

    name = "kontinuum-server"

    def __init__(
        self,
        region: str,
        zone: str,
        zone_kubeconfig: str | Path,
        hub_kubeconfig: str | Path,
        *,
        interval: float = HEARTBEAT_INTERVAL,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
    ):
        super().__init__(interval)  # a fallback: what a poll reads is watched, and a beat sets its own pause
        self.region, self.zone = region, zone
        self.heartbeat_interval = heartbeat_interval
        self._kubeconfigs = tuple(k.read_text() if isinstance(k, Path) else k for k in (zone_kubeconfig, hub_kubeconfig))
        self.zone_api = api_client(self._kubeconfigs[0])
        self.hub_api = api_client(self._kubeconfigs[1])
        self.state = State("waiting", "not polled yet")
        self._last_beat = 0.0  # monotonic time of the last heartbeat
        self._recorded: str | None = None  # last rejection recorded as an Event

    def close(self) -> None:
        self.zone_api.close()
        self.hub_api.close()

    def watched(self) -> list[tuple[str, watching.Source]]:
        """What a poll's outcome rests on: the zone's Deployment, env and identity key, and the
        hub's certificates (named from the env, so all of the hub namespace's Secrets)."""
        zone, hub_ = self._kubeconfigs
        ns = hub.ZONE_NAMESPACE
        return [(zone, watching.deployments(ns, hub.ZONE_DEPLOYMENT)),
                (zone, _named(client.CoreV1Api, "list_namespaced_config_map", ns, hub.ZONE_ENV)),
                (zone, _named(client.CoreV1Api, "list_namespaced_secret", ns, hub.ZONE_IDENTITY_SECRET)),
                (hub_, watching.Source(client.CoreV1Api, "list_namespaced_secret", (hub.HUB_NAMESPACE,)))]

    def next_pause(self) -> float:
        """Until the next heartbeat is due while heartbeating; the interval otherwise."""
        if self.state.phase != "heartbeating" or self.heartbeat_interval <= 0:
            return self.interval
        due = self._last_beat + self.heartbeat_interval - time.monotonic()
        return min(self.interval, max(due, 0.0))

    # -- observations -----------------------------------------------------------------------

    def _read(self, fn, *args):
        try:
            return fn(*args, _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def _set(self, phase: str, message: str, heartbeat: dt.datetime | None = None) -> None:
        if (phase, message) != (self.state.phase, self.state.message):
            level = self.log.warning if phase == "rejected" else self.log.info
            level("(lab stand-in) %s-%s: %s: %s", self.region, self.zone, phase, message)
        self.state = State(phase, message, heartbeat if heartbeat is not None else self.state.heartbeat)

    def poll(self) -> None:
        apps, core = client.AppsV1Api(self.zone_api), client.CoreV1Api(self.zone_api)
        ns = hub.ZONE_NAMESPACE
        dep = self._read(apps.read_namespaced_deployment, hub.ZONE_DEPLOYMENT, ns)
        if dep is None:
            return self._set("waiting", f"Deployment {ns}/{hub.ZONE_DEPLOYMENT} does not exist")
        conditions = (dep.status.conditions if dep.status else None) or []
        if not any(c.type == "Available" and c.status == "True" for c in conditions):
            return self._set("waiting", f"Deployment {ns}/{hub.ZONE_DEPLOYMENT} is not Available")

        env_cm = self._read(core.read_namespaced_config_map, hub.ZONE_ENV, ns)
        env = (env_cm.data or {}) if env_cm is not None else {}
        region = env.get(hub.ENV_REGION) or self.region
        zone = env.get(hub.ENV_ZONE) or self.zone
        endpoint = env.get(hub.ENV_ENDPOINT)

        key_secret = self._read(core.read_namespaced_secret, hub.ZONE_IDENTITY_SECRET, ns)
        cert_name = hub.hub_identity_secret_name(region, zone)
        cert_secret = self._read(client.CoreV1Api(self.hub_api).read_namespaced_secret, cert_name, hub.HUB_NAMESPACE)
        problem = identity_problem(
            _secret_value(key_secret, "tls.key"),
            _secret_value(cert_secret, hub.HUB_IDENTITY_CERT_KEY),
            key_at=f"{ns}/{hub.ZONE_IDENTITY_SECRET}",
            cert_at=cert_name,
        )
        if problem is not None:
            self._set("rejected", problem)
            self._record_rejection(dep, problem)
            return
        self._recorded = None

        name = hub.zone_object_name(region, zone)
        self._upsert(name, region, zone, endpoint)
        if time.monotonic() - self._last_beat >= self.heartbeat_interval:
            self._beat(name)

    # -- effects --------------------------------------------------------------------------------

    def _record_rejection(self, dep: client.V1Deployment, problem: str) -> None:
        """One Warning Event per distinct problem on the zone Deployment, not one per poll."""
        if problem == self._recorded:
            return
        now = _now_rfc3339()
        ns = dep.metadata.namespace
        event = {
            "metadata": {"generateName": f"{hub.ZONE_DEPLOYMENT}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": "apps/v1", "kind": "Deployment", "name": dep.metadata.name,
                "namespace": ns, "uid": dep.metadata.uid,
            },
            "type": "Warning",
            "reason": REJECTED_REASON,
            "message": f"{problem}; no heartbeat is sent to the hub",
            "source": {"component": EVENT_SOURCE},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        client.CoreV1Api(self.zone_api).create_namespaced_event(ns, event, _request_timeout=REQUEST_TIMEOUT)
        self._recorded = problem

    def _upsert(self, name: str, region: str, zone: str, endpoint: str | None) -> None:
        custom = client.CustomObjectsApi(self.hub_api)
        spec = {"region": region, "zone": zone}
        if endpoint:
            spec["endpoint"] = endpoint
        current = self._read(custom.get_cluster_custom_object, hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, name)
        if current is None:
            body = {
                "apiVersion": hub.API_VERSION,
                "kind": hub.KONTINUUM_KIND,
                "metadata": {
                    "name": name,
                    "labels": {hub.LABEL_REGION: region, hub.LABEL_ZONE: zone},
                    "annotations": {STANDIN_ANNOTATION: STANDIN_NOTE},
                },
                "spec": spec,
            }
            custom.create_cluster_custom_object(hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, body,
                                                _request_timeout=REQUEST_TIMEOUT)
            self.log.info("(lab stand-in) registered Kontinuum %s in the hub", name)
        elif current.get("spec") != spec:
            patch = {"spec": {**spec, "endpoint": spec.get("endpoint")}}  # null removes a dropped endpoint
            custom.patch_cluster_custom_object(hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, name, patch,
                                               _request_timeout=REQUEST_TIMEOUT)

    def _beat(self, name: str) -> None:
        stamp = _now_rfc3339()
        client.CustomObjectsApi(self.hub_api).patch_cluster_custom_object_status(
            hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, name, {"status": {"heartbeat": stamp}},
            _request_timeout=REQUEST_TIMEOUT,
        )
        self._last_beat = time.monotonic()
        beat = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
        self._set("heartbeating", f"Kontinuum {name} heartbeats every {self.heartbeat_interval:g} s", beat)
