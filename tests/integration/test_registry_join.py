"""Registry join against a real hub apiserver with our CRDs: joins on a heartbeat, ignores other
zones, fails bounded with a message that names the last observation and what to check.

The last test closes the loop with the lab kontinuum-server stand-in: the footprint's own
identity Secrets (from the pure builders) are what it accepts, and a wrong key is refused
with a Warning Event that the timeout message surfaces.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from kubernetes import client

from kontinuum import zone_identity
from kontinuum.hub import crds as hub
from kontinuum.hub import registry
from kontinuum.hub.registry import RegistryNotJoined, find_joined, parse_heartbeat, wait_joined
from kontinuum.stackconfig import model
from kontinuum_components import downstream
from lab.controlplane import free_port
from lab.hub import Hub
from lab.standins.kontinuum_server import REJECTED_REASON, KontinuumServer
from providers.registry_join import RegistryJoin, RegistryJoinProvider  # noqa: F401 - import must not need Pulumi running

T = 10  # seconds per API call in the tests
ADDRESS = "127.0.0.4"


def _kontinuum(name: str, region: str, zone: str, heartbeat: str | None = None, **spec) -> dict:
    obj = {"apiVersion": hub.API_VERSION, "kind": hub.KONTINUUM_KIND, "metadata": {"name": name},
           "spec": {"region": region, "zone": zone, **spec}}
    if heartbeat:
        obj["status"] = {"heartbeat": heartbeat}
    return obj


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- pure -----------------------------------------------------------------------------------


def test_parse_heartbeat():
    assert parse_heartbeat("2026-01-02T03:04:05Z") == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert parse_heartbeat("0001-01-01T00:00:00Z") is None  # Go's zero time
    assert parse_heartbeat("") is None and parse_heartbeat(None) is None and parse_heartbeat("yesterday") is None


def test_find_joined_matches_spec_not_name_and_prefers_a_heartbeat():
    items = [
        _kontinuum("eu-eu-1b", "eu", "eu-1b", "2026-01-01T00:00:00Z"),
        _kontinuum("renamed", "eu", "eu-1a", "2026-01-01T00:00:10Z", endpoint="https://eu-1a.eu.x"),
        _kontinuum("eu-eu-1a", "eu", "eu-1a"),
    ]
    joined, seen = find_joined(items, "eu", "eu-1a")
    assert joined.name == "renamed" and joined.heartbeat == "2026-01-01T00:00:10Z"
    assert joined.endpoint == "https://eu-1a.eu.x" and "renamed" in seen
    assert find_joined(items[:1], "eu", "eu-1a") == (None, "no Kontinuum for region 'eu' zone 'eu-1a' in the hub "
                                                           "(1 Kontinuum(s) for other zones)")
    joined, seen = find_joined(items[2:], "eu", "eu-1a")
    assert joined is None and seen == "Kontinuum eu-eu-1a exists but has no heartbeat"


def test_find_joined_max_age_rejects_a_stale_heartbeat():
    now = dt.datetime(2026, 1, 1, 0, 10, tzinfo=dt.timezone.utc)
    items = [_kontinuum("eu-eu-1a", "eu", "eu-1a", "2026-01-01T00:00:00Z")]
    assert find_joined(items, "eu", "eu-1a", now=now, max_age=900)[0] is not None
    joined, seen = find_joined(items, "eu", "eu-1a", now=now, max_age=60)
    assert joined is None and "600 s ago" in seen and "stale" in seen


def test_find_joined_newer_than_reads_the_hubs_clock_not_the_zones():
    """A zone server whose clock runs an hour behind still joins: what counts is when the hub
    took its heartbeat (managedFields, the hub's clock), compared with the hub's time."""
    hub_now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    obj = _kontinuum("eu-eu-1a", "eu", "eu-1a", "2026-01-01T11:00:05Z")  # the zone's clock
    obj["metadata"]["managedFields"] = [
        {"manager": "kontinuum-server", "operation": "Update", "subresource": "status", "time": "2026-01-01T12:00:05Z"},
        {"manager": "kubectl", "operation": "Update", "time": "2026-01-01T13:00:00Z"},  # spec: not a heartbeat
    ]
    assert find_joined([obj], "eu", "eu-1a", newer_than=(hub_now, "when the wait began"))[0] is not None
    obj["metadata"]["managedFields"][0]["time"] = "2026-01-01T11:59:00Z"  # taken before the wait
    joined, seen = find_joined([obj], "eu", "eu-1a", newer_than=(hub_now, "when the wait began"))
    assert joined is None and "too old" in seen


def test_provider_check_and_diff_are_pure():
    p = RegistryJoinProvider()
    good = {"hubKubeconfig": "x", "region": "eu", "zone": "eu-1a", "timeout": 5}
    assert p.check({}, good).failures == []
    bad = p.check({}, {"region": "eu", "timeout": -1})
    assert sorted(f.property for f in bad.failures) == ["hubKubeconfig", "timeout", "zone"]
    assert p.diff("id", good, dict(good)).changes is False
    assert p.diff("id", good, dict(good, timeout=99)).changes is False  # a new bound alone does not re-wait
    d = p.diff("id", good, dict(good, trigger="new-footprint"))
    assert d.changes is True and not d.replaces


# -- against a real hub -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_(tools_bin, tmp_path_factory):
    # No controller-manager: the tests play the deployment controller (they mark Deployments
    # Available), and a real one would undo that.
    h = Hub.on_free_ports(tmp_path_factory.mktemp("hub"), ADDRESS, name="hub-registry", controllers=False).start()
    yield h
    h.stop()


@pytest.fixture
def api(hub_):
    a = hub_.api_client()
    yield a
    a.close()


def _create(api, obj: dict) -> None:
    custom = client.CustomObjectsApi(api)
    status = obj.pop("status", None)
    custom.create_cluster_custom_object(hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, obj, _request_timeout=T)
    if status:
        _beat(api, obj["metadata"]["name"], status["heartbeat"])


def _beat(api, name: str, stamp: str) -> None:
    client.CustomObjectsApi(api).patch_cluster_custom_object_status(
        hub.GROUP, hub.VERSION, hub.KONTINUUM_PLURAL, name, {"status": {"heartbeat": stamp}}, _request_timeout=T)


@pytest.fixture
def short_grace(monkeypatch):
    """Freshness is judged by the hub's clock (when it took a heartbeat), which a test cannot
    backdate: shrink the grace and let an old heartbeat age past it instead."""
    monkeypatch.setattr(registry, "FRESH_GRACE", 1.0)


def _age_past_grace() -> None:
    time.sleep(2.5)  # the hub's times have whole seconds


def test_joins_when_a_heartbeat_appears(hub_, api, short_grace):
    _create(api, _kontinuum("eu-eu-1a", "eu", "eu-1a", endpoint="https://eu-1a.eu.lab.test"))
    later = threading.Timer(1.5, lambda: _beat(api, "eu-eu-1a", _now()))
    later.start()
    t0 = time.monotonic()
    out = RegistryJoinProvider().create({"hubKubeconfig": hub_.kubeconfig, "region": "eu", "zone": "eu-1a",
                                         "timeout": 30, "trigger": "t1"})
    later.join()
    assert 1.0 < time.monotonic() - t0 < 30
    assert out.id == "eu-eu-1a"
    assert out.outs["joined"] is True and out.outs["kontinuum"] == "eu-eu-1a"
    assert parse_heartbeat(out.outs["heartbeat"]) is not None
    assert out.outs["endpoint"] == "https://eu-1a.eu.lab.test"
    # A changed footprint waits again, and a heartbeat older than the grace does not count.
    _beat(api, "eu-eu-1a", (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=90)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    _age_past_grace()
    with pytest.raises(RegistryNotJoined, match=r"last heartbeated at .*\(the hub took it at .*\), too old: waiting for "
                                                r"one the hub takes at or after .* \(1 s before this wait began, by"):
        RegistryJoinProvider().update("eu-eu-1a", out.outs, dict(out.outs, trigger="t2", timeout=2))
    later = threading.Timer(1.5, lambda: _beat(api, "eu-eu-1a", _now()))
    later.start()
    upd = RegistryJoinProvider().update("eu-eu-1a", out.outs, dict(out.outs, trigger="t2"))
    later.join()
    assert upd.outs["joined"] is True and parse_heartbeat(upd.outs["heartbeat"]) >= parse_heartbeat(out.outs["heartbeat"])


def test_create_ignores_a_registration_left_from_an_earlier_life_of_the_zone(hub_, api, short_grace):
    _create(api, _kontinuum("eu-eu-1f", "eu", "eu-1f", _now()))  # a zone clock that looks fresh
    _age_past_grace()
    with pytest.raises(RegistryNotJoined) as e:
        RegistryJoinProvider().create({"hubKubeconfig": hub_.kubeconfig, "region": "eu", "zone": "eu-1f",
                                       "timeout": 1.5})
    assert "Kontinuum eu-eu-1f last heartbeated at " in str(e.value)
    assert "too old: waiting for one the hub takes at or after " in str(e.value)
    assert "(1 s before this wait began, by the hub's clock)" in str(e.value)


def test_times_out_bounded_when_nothing_registers(hub_):
    t0 = time.monotonic()
    with pytest.raises(RegistryNotJoined) as e:
        RegistryJoinProvider().create({"hubKubeconfig": hub_.kubeconfig, "region": "eu", "zone": "eu-9z",
                                       "timeout": 2})
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert msg.startswith("zone eu-eu-9z never joined the hub registry within 2 s: ")
    assert "no Kontinuum for region 'eu' zone 'eu-9z'" in msg
    assert "did not start or was refused" in msg
    assert f"{hub.ZONE_NAMESPACE}/{hub.ZONE_IDENTITY_SECRET}" in msg
    assert f"{hub.HUB_NAMESPACE}/{hub.hub_identity_secret_name('eu', 'eu-9z')}" in msg
    assert "server's logs" in msg


def test_registered_without_heartbeat_is_not_joined(hub_, api):
    _create(api, _kontinuum("eu-eu-1c", "eu", "eu-1c"))
    with pytest.raises(RegistryNotJoined, match="Kontinuum eu-eu-1c exists but has no heartbeat"):
        wait_joined(hub_.kubeconfig, "eu", "eu-1c", timeout=1.5, interval=0.3)


def test_ignores_a_kontinuum_of_another_zone(hub_, api):
    _create(api, _kontinuum("us-eu-1d", "us", "eu-1d", _now()))  # same zone name, other region
    _create(api, _kontinuum("eu-eu-1e", "eu", "eu-1e", _now()))  # same region, other zone
    _create(api, _kontinuum("eu-eu-1d", "eu", "eu-1e-typo"))     # our name, other spec
    with pytest.raises(RegistryNotJoined) as e:
        wait_joined(hub_.kubeconfig, "eu", "eu-1d", timeout=1.5, interval=0.3)
    assert "no Kontinuum for region 'eu' zone 'eu-1d'" in str(e.value)
    assert wait_joined(hub_.kubeconfig, "us", "eu-1d", timeout=5).name == "us-eu-1d"


def test_unreachable_hub_is_a_bounded_observation(hub_):
    dead = hub_.kubeconfig.replace(hub_.server, f"https://{ADDRESS}:{free_port(ADDRESS)}")
    t0 = time.monotonic()
    with pytest.raises(RegistryNotJoined) as e:
        wait_joined(dead, "eu", "eu-1a", timeout=1.0, interval=0.3)
    assert time.monotonic() - t0 < 20
    msg = str(e.value)
    assert "cannot list Kontinuums on the hub (NewConnectionError: " in msg and "object at 0x" not in msg
    assert "The hub itself could not be read: check the hub kubeconfig" in msg


# -- the loop with the lab kontinuum-server stand-in -------------------------------------------------


def _apply_zone_side(api, manifests: list[dict]) -> None:
    """Create the footprint's objects on the (shared) apiserver the way Pulumi would."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    for m in manifests:
        ns = m["metadata"].get("namespace")
        kind = m["kind"]
        if kind == "Secret":
            try:
                core.delete_namespaced_secret(m["metadata"]["name"], ns, _request_timeout=T)
            except client.ApiException as e:
                if e.status != 404:
                    raise
            core.create_namespaced_secret(ns, m, _request_timeout=T)
        elif kind == "ConfigMap":
            core.create_namespaced_config_map(ns, m, _request_timeout=T)
        elif kind == "Deployment":
            apps.create_namespaced_deployment(ns, m, _request_timeout=T)
        else:
            raise AssertionError(kind)


def _mark_available(api) -> None:
    """No controller-manager here: play the Deployment controller's verdict."""
    now = _now()
    client.AppsV1Api(api).patch_namespaced_deployment_status(hub.ZONE_DEPLOYMENT, hub.ZONE_NAMESPACE, {"status": {
        "replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1,
        "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                        "message": "Deployment has minimum availability.", "lastUpdateTime": now,
                        "lastTransitionTime": now}]}}, _request_timeout=T)


def test_stand_in_refuses_a_wrong_key_then_joins_with_the_footprint_identity(hub_, api):
    """One apiserver plays hub and zone (namespaces coincide). The footprint's own builders
    produce the env ConfigMap, the zone identity Secret and the hub certificate Secret."""
    region, zone = "lab", "z1"
    hub_cfg = model.Hub("lab.test", "hub.lab.test:443", "ops@lab.test", "https://acme.invalid/dir",
                        model.Auth("anonymous"))
    ident, wrong = zone_identity.issue(region, zone), zone_identity.issue(region, zone)
    secret_data, cm_data = downstream.env_config(region, zone, hub_cfg)
    _apply_zone_side(api, [
        downstream.env_secret_manifest(region, zone, secret_data),
        downstream.env_configmap_manifest(region, zone, cm_data),
        downstream.identity_secret_manifest(region, zone, wrong.certificate_pem, wrong.private_key_pem),
        downstream.hub_identity_secret_manifest(region, zone, ident.certificate_pem, ident.thumbprint),
        downstream.deployment_manifest(region, zone, "kontinuum:test", "hash"),
    ])
    _mark_available(api)
    server = KontinuumServer(region, zone, hub_.kubeconfig, hub_.kubeconfig, interval=0.2)
    try:
        server.poll_once()
        assert server.last_error is None and server.state.phase == "rejected", server.state

        with pytest.raises(RegistryNotJoined) as e:
            wait_joined(hub_.kubeconfig, region, zone, timeout=5.0, interval=0.3, zone_kubeconfig=hub_.kubeconfig)
        msg = str(e.value)
        assert "no Kontinuum for region 'lab' zone 'z1'" in msg
        assert f"on the zone: Deployment {hub.ZONE_NAMESPACE}/{hub.ZONE_DEPLOYMENT} is Available" in msg
        assert f"Warning {REJECTED_REASON}" in msg and "does not match the hub's certificate" in msg

        # deliver the right key, as a corrected footprint would
        _apply_zone_side(api, [downstream.identity_secret_manifest(region, zone, ident.certificate_pem,
                                                                   ident.private_key_pem)])
        server.start()
        out = RegistryJoinProvider().create({"hubKubeconfig": hub_.kubeconfig, "zoneKubeconfig": hub_.kubeconfig,
                                             "region": region, "zone": zone, "timeout": 30})
        assert out.outs["joined"] is True and out.outs["kontinuum"] == "lab-z1"
        assert out.outs["endpoint"] == "https://z1.lab.lab.test"
    finally:
        server.stop()


def test_update_waits_for_the_new_revision_to_roll_out_then_for_its_heartbeat(hub_, api):
    """The hub apiserver plays the zone too. While the old pods still run, their heartbeats do
    not count; once the newest revision runs alone, a heartbeat from then on does."""
    region, zone, ns = "lab", "z2", hub.ZONE_NAMESPACE
    apps = client.AppsV1Api(api)
    try:
        apps.create_namespaced_deployment(ns, downstream.deployment_manifest(region, zone, "kontinuum:test", "h1"),
                                          _request_timeout=T)
    except client.ApiException as e:
        if e.status != 409:  # the stand-in test above left one: as good
            raise
    gen = apps.read_namespaced_deployment(hub.ZONE_DEPLOYMENT, ns, _request_timeout=T).metadata.generation

    def status(replicas: int) -> None:
        apps.patch_namespaced_deployment_status(hub.ZONE_DEPLOYMENT, ns, {"status": {
            "observedGeneration": gen, "replicas": replicas, "updatedReplicas": 1, "availableReplicas": 1}},
            _request_timeout=T)

    _create(api, _kontinuum("lab-z2", region, zone, _now()))
    stop = threading.Event()

    def server() -> None:  # heartbeats every second, whichever pod it is
        while not stop.wait(1.0):
            _beat(api, "lab-z2", _now())

    beats = threading.Thread(target=server, daemon=True)
    beats.start()
    props = {"hubKubeconfig": hub_.kubeconfig, "zoneKubeconfig": hub_.kubeconfig, "region": region, "zone": zone,
             "timeout": 30, "trigger": "t2"}
    try:
        status(2)  # one new pod, one old one still running
        with pytest.raises(RegistryNotJoined) as e:
            RegistryJoinProvider().update("lab-z2", props, dict(props, timeout=4))
        assert f"Deployment {ns}/{hub.ZONE_DEPLOYMENT} rolling out: 1 of 1 updated, 1 available, 2 in all" in str(e.value)

        status(1)
        done = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        out = RegistryJoinProvider().update("lab-z2", props, props)
        assert out.outs["joined"] is True and parse_heartbeat(out.outs["heartbeat"]) >= done
    finally:
        stop.set()
        beats.join(timeout=10)
