"""Hub registry lookup: has this zone's kontinuum-server joined (seeds, "Registry join")?

A zone has joined once the hub holds a Kontinuum whose spec.region/spec.zone are the zone's
and whose status.heartbeat is non-zero (the seeds' FindJoinedKontinuum). The matching is by
spec, not by object name, so a server that registered under another name still counts and
another zone's Kontinuum never does.

Installed says the downstream objects exist and TLS was issued; it says nothing about whether
the server started and was accepted by the hub. When it was not, the hub shows nothing, so on
timeout this module also looks at the zone side (Deployment availability and the newest
Warning Event on it, where the server — or the lab stand-in — records why it was refused)
and puts what it finds into the message.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import time
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.rest import ApiException

from kontinuum.errors import KontinuumError
from kontinuum.hub import crds as hub
from kontinuum.kube import watching
from kontinuum.kube.clients import api_client, describe_error

REQUEST_TIMEOUT = 15.0  # seconds per API call
FRESH_GRACE = 30.0  # seconds: how much older than the join's wait a fresh heartbeat may be
_ZERO_YEAR = 1  # Go's zero time.Time serialises as 0001-01-01T00:00:00Z


class RegistryNotJoined(KontinuumError):
    """The zone's kontinuum-server never heartbeated into the hub registry within the bound."""


@dataclass(frozen=True)
class Joined:
    name: str
    heartbeat: str
    endpoint: str | None


# -- pure ---------------------------------------------------------------------------------


def parse_heartbeat(value) -> dt.datetime | None:
    """The heartbeat as an aware datetime, or None when absent, unparsable or Go's zero time."""
    if not isinstance(value, str) or not value:
        return None
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return None if t.year <= _ZERO_YEAR else t


def written_at(obj: dict) -> dt.datetime | None:
    """When the hub last took a status write (a heartbeat) of this object, by the hub's own
    clock (managedFields): compared with the hub's time, never with the zone server's clock."""
    times = [parse_heartbeat(f.get("time")) for f in (obj.get("metadata") or {}).get("managedFields") or []
             if f.get("subresource") == "status"]
    return max((t for t in times if t is not None), default=None)


def _matches(obj: dict, region: str, zone: str) -> bool:
    spec = obj.get("spec") or {}
    return spec.get("region") == region and spec.get("zone") == zone


def find_joined(items: list[dict], region: str, zone: str, *, now: dt.datetime | None = None,
                max_age: float | None = None, newer_than: tuple[dt.datetime, str] | None = None
                ) -> tuple[Joined | None, str]:
    """(the joined Kontinuum or None, one line saying what was observed).

    max_age (seconds), when set, also demands the heartbeat be at most that old by `now`, so a
    stale registration left from an earlier life of the zone does not count. newer_than, a
    (moment, what happened then) pair, demands a heartbeat from that second on: a server that
    was (re)started since. Heartbeats carry whole seconds, so the moment's second counts.
    """
    mine = [o for o in items if _matches(o, region, zone)]
    if not mine:
        others = len(items)
        return None, (f"no Kontinuum for region {region!r} zone {zone!r} in the hub"
                      + (f" ({others} Kontinuum(s) for other zones)" if others else ""))
    beats = sorted(((parse_heartbeat((o.get("status") or {}).get("heartbeat")), o) for o in mine),
                   key=lambda p: (p[0] is not None, p[0] or dt.datetime.min.replace(tzinfo=dt.timezone.utc)),
                   reverse=True)
    beat, obj = beats[0]
    name = obj["metadata"]["name"]
    if beat is None:
        raw = (obj.get("status") or {}).get("heartbeat")
        return None, (f"Kontinuum {name} exists but has no heartbeat"
                      + (f" (status.heartbeat is {raw!r})" if raw else ""))
    stamp = beat.strftime("%Y-%m-%dT%H:%M:%SZ")
    if max_age is not None and max_age > 0:
        age = ((now or dt.datetime.now(dt.timezone.utc)) - beat).total_seconds()
        if age > max_age:
            return None, (f"Kontinuum {name} last heartbeated at {stamp}, {age:.0f} s ago "
                          f"(more than {max_age:g} s: stale)")
    taken = written_at(obj)
    if newer_than is not None and (taken or beat) < newer_than[0].replace(microsecond=0):
        since = newer_than[0].strftime("%Y-%m-%dT%H:%M:%SZ")
        when = f" (the hub took it at {taken.strftime('%Y-%m-%dT%H:%M:%SZ')})" if taken else ""
        return None, (f"Kontinuum {name} last heartbeated at {stamp}{when}, too old: waiting for one the hub takes "
                      f"at or after {since} ({newer_than[1]}, by the hub's clock)")
    return Joined(name, stamp, (obj.get("spec") or {}).get("endpoint")), f"Kontinuum {name} heartbeat {stamp}"


def timeout_message(region: str, zone: str, timeout: float, last: str, zone_side: str | None,
                    *, hub_unreadable: bool = False) -> str:
    zname = hub.zone_object_name(region, zone)
    seen = last + (f"; on the zone: {zone_side}" if zone_side else "")
    if hub_unreadable:
        advice = ("The hub itself could not be read: check the hub kubeconfig (stack config hubKubeconfig), that "
                  "the hub is reachable from here and that the kontinuum.sh CRDs are installed")
    else:
        advice = ("Its kontinuum-server did not start or was refused: check that the identity key in "
                  f"{hub.ZONE_NAMESPACE}/{hub.ZONE_IDENTITY_SECRET} on the zone matches the hub certificate "
                  f"{hub.HUB_NAMESPACE}/{hub.hub_identity_secret_name(region, zone)} and the server's logs "
                  f"(kubectl -n {hub.ZONE_NAMESPACE} logs deploy/{hub.ZONE_DEPLOYMENT})")
    return f"zone {zname} never joined the hub registry within {timeout:g} s: {seen}. {advice}, then run `pulumi up` again."


def deployment_observation(dep: client.V1Deployment | None) -> str:
    ns, name = hub.ZONE_NAMESPACE, hub.ZONE_DEPLOYMENT
    if dep is None:
        return f"Deployment {ns}/{name} does not exist"
    for c in (dep.status.conditions if dep.status else None) or []:
        if c.type == "Available":
            if c.status == "True":
                return f"Deployment {ns}/{name} is Available"
            why = ": ".join(x for x in (c.reason, c.message) if x)
            return f"Deployment {ns}/{name} is not Available" + (f" ({why})" if why else "")
    return f"Deployment {ns}/{name} has no Available condition yet"


def newest_warning(events: list[client.CoreV1Event]) -> str | None:
    warnings = [e for e in events if e.type == "Warning"]
    if not warnings:
        return None

    def when(e: client.CoreV1Event):
        t = e.last_timestamp or e.event_time or e.first_timestamp or (e.metadata.creation_timestamp if e.metadata else None)
        return t or dt.datetime.min.replace(tzinfo=dt.timezone.utc)

    e = max(warnings, key=when)
    source = (e.source.component if e.source and e.source.component else None) or e.reporting_component
    return f"Warning {e.reason}" + (f" from {source}" if source else "") + f": {e.message}"


# -- I/O ------------------------------------------------------------------------------------


class Registry:
    """The Kontinuum objects on the hub."""

    def __init__(self, api: client.CustomObjectsApi, timeout: float = REQUEST_TIMEOUT):
        self.api = api
        self.timeout = timeout

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str, timeout: float = REQUEST_TIMEOUT) -> "Registry":
        return cls(client.CustomObjectsApi(api_client(kubeconfig)), timeout)

    def list(self) -> list[dict]:
        return self.list_at()[0]

    def list_at(self) -> tuple[list[dict], dt.datetime]:
        """The Kontinuum objects and the hub's time of the answer (its Date header; this
        machine's clock only when the hub sends none)."""
        out, _status, headers = self.api.list_cluster_custom_object_with_http_info(
            hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, _request_timeout=self.timeout)
        try:
            now = email.utils.parsedate_to_datetime(headers["Date"])
        except (KeyError, TypeError, ValueError):
            now = dt.datetime.now(dt.timezone.utc)
        return out.get("items") or [], now

    def close(self) -> None:
        self.api.api_client.close()


def zone_side_observation(zone_kubeconfig: str | None, timeout: float = REQUEST_TIMEOUT) -> str | None:
    """What the zone cluster shows about its server: Deployment availability and the newest
    Warning Event on it. Best effort: None when there is no kubeconfig, the text of the
    failure when the zone cannot be read (the message must still be written)."""
    if not zone_kubeconfig:
        return None
    try:
        api = api_client(zone_kubeconfig)
    except Exception as e:  # noqa: BLE001 - a bad kubeconfig is an observation, not a new failure
        return f"cannot read the zone cluster ({describe_error(e)})"
    try:
        apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
        ns, name = hub.ZONE_NAMESPACE, hub.ZONE_DEPLOYMENT
        try:
            dep = apps.read_namespaced_deployment(name, ns, _request_timeout=timeout)
        except ApiException as e:
            if e.status != 404:
                raise
            dep = None
        parts = [deployment_observation(dep)]
        if dep is not None:
            selector = f"involvedObject.kind=Deployment,involvedObject.name={name}"
            events = core.list_namespaced_event(ns, field_selector=selector, _request_timeout=timeout).items
            warning = newest_warning(events)
            if warning:
                parts.append(f"last event {warning}")
        return "; ".join(parts)
    except Exception as e:  # noqa: BLE001
        return f"cannot read the zone cluster ({describe_error(e)})"
    finally:
        api.close()


def rollout_observation(zone_kubeconfig: str, timeout: float = REQUEST_TIMEOUT) -> tuple[bool, str]:
    """(whether the server Deployment's newest revision runs alone and available, what was seen)."""
    api = api_client(zone_kubeconfig)
    ns, name = hub.ZONE_NAMESPACE, hub.ZONE_DEPLOYMENT
    try:
        dep = client.AppsV1Api(api).read_namespaced_deployment(name, ns, _request_timeout=timeout)
    except Exception as e:  # noqa: BLE001 - a missing Deployment or unreachable zone is an observation
        return False, f"cannot read Deployment {ns}/{name} on the zone ({describe_error(e)})"
    finally:
        api.close()
    return rollout_done(dep)


def rollout_done(dep: client.V1Deployment) -> tuple[bool, str]:
    want = dep.spec.replicas if dep.spec and dep.spec.replicas is not None else 1
    st = dep.status or client.V1DeploymentStatus()
    seen = (f"Deployment {hub.ZONE_NAMESPACE}/{hub.ZONE_DEPLOYMENT} rolling out: {st.updated_replicas or 0} of "
            f"{want} updated, {st.available_replicas or 0} available, {st.replicas or 0} in all")
    if (st.observed_generation or 0) < (dep.metadata.generation or 0):
        return False, seen + " (change not yet observed)"
    done = (st.updated_replicas or 0) >= want and (st.available_replicas or 0) >= want \
        and (st.replicas or 0) <= (st.updated_replicas or 0)
    return done, seen


def wait_joined(hub_kubeconfig: str, region: str, zone: str, *, timeout: float, interval: float = 3.0,
                max_age: float | None = None, zone_kubeconfig: str | None = None,
                fresh: bool = False, after_rollout: bool = False) -> Joined:
    """Block (bounded by `timeout`) until a Kontinuum for region/zone has a non-zero heartbeat.

    fresh: only a heartbeat from FRESH_GRACE seconds before this wait on counts: the zone's
    server heartbeats as soon as it is available, which is just before the join starts waiting,
    while a registration left from an earlier life of the zone is older than bringing the zone
    up again takes. after_rollout (with zone_kubeconfig): first wait until the
    server Deployment's newest revision runs alone, then demand a heartbeat from then on, so a
    changed server is seen to join, not the old pods it replaces.
    """
    registry = Registry.from_kubeconfig(hub_kubeconfig)
    deadline = time.monotonic() + timeout
    # Moments are taken by the hub's clock (its answers' Date) and compared with the hub's record
    # of each heartbeat write, so neither this machine's clock nor the zone's matters.
    want = ("fresh", f"{FRESH_GRACE:g} s before this wait began") if fresh or after_rollout else None
    since = None
    rolled_out = not (after_rollout and zone_kubeconfig)
    last, hub_unreadable = "no observation yet", False
    watched = [(hub_kubeconfig, watching.custom_objects(hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL))]
    if not rolled_out:
        watched.append((zone_kubeconfig, watching.deployments(hub.ZONE_NAMESPACE, hub.ZONE_DEPLOYMENT)))
    try:
        with watching.Waker(*watched) as waker:
            while True:
                if not rolled_out:
                    rolled_out, last = rollout_observation(zone_kubeconfig)
                    if rolled_out:
                        want, since = ("rollout", "when the server's rollout completed"), None
                if rolled_out:
                    try:
                        items, hub_now = registry.list_at()
                        if want is not None and since is None:
                            grace = FRESH_GRACE if want[0] == "fresh" else 0.0
                            since = (hub_now - dt.timedelta(seconds=grace), want[1])
                        joined, last = find_joined(items, region, zone, max_age=max_age, newer_than=since)
                        hub_unreadable = False
                        if joined is not None:
                            return joined
                    except Exception as e:  # noqa: BLE001 - an unreachable hub is an observation too
                        last, hub_unreadable = f"cannot list Kontinuums on the hub ({describe_error(e)})", True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RegistryNotJoined(timeout_message(region, zone, timeout, last,
                                                            zone_side_observation(zone_kubeconfig),
                                                            hub_unreadable=hub_unreadable))
                waker.pause(min(interval, remaining))
    finally:
        registry.close()
