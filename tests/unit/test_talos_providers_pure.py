"""The Talos providers' check and diff: pure (no socket is ever opened, so `pulumi preview`
contacts nothing), tolerant of preview's unknowns, and planning the right replaces/changes."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import dill
import pulumi
import pulumi.dynamic
import pytest
from pulumi.runtime import rpc

from kontinuum.talos import machineconfig as mc
from kontinuum.talos import secrets, talosconfig
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, PoolSpec
from providers.bootstrap import Bootstrap, BootstrapProvider
from providers.ca_rotation import CaRotation
from providers.cluster_health import ClusterHealth, ClusterHealthProvider
from providers.config_apply import ConfigApply, ConfigApplyProvider
from providers.kubeconfig import Kubeconfig, KubeconfigProvider
from providers.talos_common import config_hash
from providers.talos_secrets import TalosSecrets, TalosSecretsProvider

FIXTURE = Path(__file__).parent / "fixtures" / "talosctl-secrets.yaml"
UNKNOWN = rpc.UNKNOWN
ADDRESS = "127.0.31.1"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("check/diff must not touch the network")

    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture(scope="module")
def bundle():
    return secrets.load(FIXTURE.read_text())


@pytest.fixture(scope="module")
def tc(bundle) -> str:
    return talosconfig.render("t", [ADDRESS], [], bundle.os.crt, talosconfig.issue_client_cert(bundle.os))


def _config(bundle, pool: str = CONTROLPLANE, **spec) -> str:
    workers = (PoolSpec("w", 1),) if pool != CONTROLPLANE else ()
    spec = ClusterSpec(name="t", endpoint=f"https://{ADDRESS}:6443", kubernetes_version="1.35.4",
                       workers=workers, **spec)
    return mc.render(spec, bundle, pool=pool).decode()


@pytest.fixture(scope="module")
def apply_news(bundle, tc) -> dict:
    return {"instance": "e2e-a-0123abcd", "pool": "controlplane", "address": ADDRESS, "role": "controlplane",
            "config": _config(bundle), "talosconfig": tc}


def _recorded(news: dict) -> dict:
    """What create would record for these inputs: check's normalised inputs, the config as a hash."""
    checked = ConfigApplyProvider().check({}, news)
    assert not checked.failures
    outs = {k: v for k, v in checked.inputs.items() if k != "config"}
    return {**outs, "configHash": config_hash(news["config"])}


# --- ConfigApply ----------------------------------------------------------------------------------


def test_config_apply_check_fills_defaults(apply_news):
    result = ConfigApplyProvider().check({}, {**apply_news, "talosPort": 50000.0})
    assert not result.failures
    assert result.inputs["talosPort"] == 50000 and isinstance(result.inputs["talosPort"], int)
    assert result.inputs["leaveEtcdOnDelete"] is True and result.inputs["resetOnDelete"] is True
    assert result.inputs["skipUnreachable"] is False and result.inputs["applyTimeout"] > 0


def test_config_apply_check_worker_defaults_and_role_mismatch(bundle, apply_news):
    worker = _config(bundle, pool="w")
    ok = ConfigApplyProvider().check({}, {**apply_news, "role": "worker", "config": worker})
    assert not ok.failures and ok.inputs["leaveEtcdOnDelete"] is False

    bad = ConfigApplyProvider().check({}, {**apply_news, "config": worker})
    assert [(f.property, f.reason) for f in bad.failures] == [("config", "is a worker config but role is controlplane")]


def test_config_apply_check_failures_never_echo_secrets(bundle, apply_news):
    result = ConfigApplyProvider().check({}, {
        **apply_news, "talosPort": 70000, "role": "master", "applyTimeout": 0,
        "talosconfig": "context: x\ncontexts: {x: {endpoints: [a], ca: '%%%'}}", "config": "machine: [",
    })
    reasons = {f.property: f.reason for f in result.failures}
    assert set(reasons) == {"talosPort", "role", "applyTimeout", "talosconfig"}
    assert "%%%" not in reasons["talosconfig"]
    assert "not valid YAML" in ConfigApplyProvider().check({}, {**apply_news, "config": "a: [\n"}).failures[0].reason
    secret_key = secrets.secret_values(bundle)[0]
    assert all(secret_key not in r for r in reasons.values())


def test_config_apply_check_lets_unknowns_through(apply_news):
    news = {**apply_news, "address": UNKNOWN, "config": UNKNOWN, "talosconfig": UNKNOWN, "role": UNKNOWN}
    assert not ConfigApplyProvider().check({}, news).failures


@pytest.mark.parametrize(
    "change, replaces",
    [
        ({}, None),
        ({"applyTimeout": 5.0}, []),
        ({"skipUnreachable": True}, []),
        ({"address": "127.0.31.2"}, []),  # the same machine (Instance) answering elsewhere
        ({"instance": "e2e-a-4567cdef"}, ["instance"]),  # another machine
        ({"role": "worker"}, ["role"]),
        ({"config": "changed"}, []),
        ({"config": UNKNOWN}, []),
        ({"address": UNKNOWN}, []),
        ({"wipe": "disk"}, []),
    ],
)
def test_config_apply_diff(apply_news, change, replaces):
    olds = _recorded(apply_news)
    news = {**ConfigApplyProvider().check({}, apply_news).inputs, **change}
    diff = ConfigApplyProvider().diff(ADDRESS, olds, news)
    if replaces is None:
        assert not diff.changes and diff.replaces == []
    else:
        assert diff.changes and diff.replaces == replaces and diff.delete_before_replace


def test_config_apply_recorded_before_identities_is_the_same_machine(apply_news):
    """State written before ConfigApply had an `instance` (per-slot resources) migrates to the
    per-machine resource without a replace when the address matches, and only then."""
    legacy = {k: v for k, v in _recorded(apply_news).items() if k not in ("instance", "pool")}
    news = ConfigApplyProvider().check({}, apply_news).inputs
    diff = ConfigApplyProvider().diff(ADDRESS, legacy, news)
    assert diff.replaces == []
    moved = ConfigApplyProvider().diff(ADDRESS, {**legacy, "address": "127.0.31.9"}, news)
    assert moved.replaces == ["instance"]


@pytest.mark.parametrize("prop, value", [("pool", "web"), ("role", "worker")])
def test_config_apply_refuses_moving_a_machine_that_holds_data(apply_news, prop, value):
    olds = ConfigApplyProvider().check({}, apply_news).inputs
    failures = ConfigApplyProvider().check(olds, {**apply_news, prop: value}).failures
    assert [f.property for f in failures][:1] == [prop]
    assert "cannot move" in failures[0].reason and "Remove it from the zone first" in failures[0].reason
    assert not ConfigApplyProvider().check(olds, {**apply_news, prop: UNKNOWN}).failures


def test_config_apply_wipe_is_checked(apply_news):
    assert ConfigApplyProvider().check({}, apply_news).inputs["wipe"] == "state"
    failures = ConfigApplyProvider().check({}, {**apply_news, "wipe": "everything"}).failures
    assert [f.property for f in failures] == ["wipe"]


def test_config_apply_update_of_settings_only_contacts_nothing(apply_news):
    olds = _recorded(apply_news)
    news = {**ConfigApplyProvider().check({}, apply_news).inputs, "resetTimeout": 7.0}
    outs = ConfigApplyProvider().update(ADDRESS, olds, news).outs
    assert outs["resetTimeout"] == 7.0 and outs["configHash"] == olds["configHash"] and "config" not in outs


# --- TalosSecrets ---------------------------------------------------------------------------------


def test_secrets_check_and_diff():
    provider = TalosSecretsProvider()
    text = FIXTURE.read_text()
    olds = {"clusterName": "t", "endpoints": [ADDRESS], "importYaml": text}
    assert not provider.check({}, olds).failures
    assert [f.property for f in provider.check({}, {"clusterName": "", "endpoints": []}).failures] == [
        "clusterName", "endpoints"]
    bad = provider.check({}, {**olds, "importYaml": "cluster: {}\n"}).failures
    assert bad[0].property == "importYaml" and "not a talosctl secrets.yaml" in bad[0].reason

    reindented = text.replace("    ", "  ")  # the same bundle, formatted differently
    assert reindented != text and not provider.check(olds, {**olds, "importYaml": reindented}).failures
    changed = provider.check(olds, {**olds, "importYaml": None}).failures
    assert [f.property for f in changed] == ["importYaml"] and "never rotated" in changed[0].reason
    generated = {"clusterName": "t", "endpoints": [ADDRESS]}
    assert provider.check(generated, {**generated, "importYaml": text}).failures  # import added later
    assert not provider.check(olds, {**olds, "importYaml": UNKNOWN}).failures

    outs = {"clusterName": "t", "endpoints": [ADDRESS], "secretsYaml": "s", "talosconfig": "t"}
    assert not provider.diff("t", outs, {"clusterName": "t", "endpoints": [ADDRESS]}).changes
    for news in ({"clusterName": "u", "endpoints": [ADDRESS]}, {"clusterName": "t", "endpoints": [UNKNOWN]},
                 {"clusterName": "t", "endpoints": [ADDRESS], "importYaml": text}):
        diff = provider.diff("t", outs, news)
        assert diff.replaces == []  # never replaced


# --- Bootstrap, Kubeconfig, ClusterHealth ---------------------------------------------------------


def test_bootstrap_never_replaces(tc):
    provider = BootstrapProvider()
    news = provider.check({}, {"address": ADDRESS, "talosconfig": tc}).inputs
    assert news["timeout"] > 0 and news["talosPort"] == 50000
    olds = {**news, "bootstrapped": True}
    diff = provider.diff(ADDRESS, olds, {**news, "address": "127.0.31.2"})
    assert diff.changes and diff.replaces == []
    outs = provider.update(ADDRESS, olds, {**news, "address": "127.0.31.2"}).outs  # recorded, not re-run
    assert outs["bootstrapped"] is True and outs["address"] == "127.0.31.2"


def test_kubeconfig_and_health_checks(tc):
    k = KubeconfigProvider().check({}, {"address": ADDRESS, "talosconfig": tc})
    assert not k.failures and k.inputs["timeout"] > 0 and 0 < k.inputs["requestTimeout"] < k.inputs["timeout"]
    olds = {**k.inputs, "kubeconfig": "k", "endpoint": "https://e:6443", "kubernetesVersion": "v1"}
    outs = KubeconfigProvider().update(ADDRESS, olds, {**k.inputs, "timeout": 5.0}).outs  # bound only: no fetch
    assert outs["kubeconfig"] == "k" and outs["timeout"] == 5.0

    h = ClusterHealthProvider().check({}, {"address": ADDRESS, "talosconfig": tc, "controlPlaneNodes": [ADDRESS]})
    assert not h.failures and h.inputs["workerNodes"] == []
    missing = ClusterHealthProvider().check({}, {"address": ADDRESS, "talosconfig": tc, "controlPlaneNodes": []})
    assert [f.property for f in missing.failures] == ["controlPlaneNodes"]
    diff = ClusterHealthProvider().diff(ADDRESS, {**h.inputs, "healthy": True}, {**h.inputs, "workerNodes": ["w"]})
    assert diff.changes and diff.replaces == []


# --- the resources ----------------------------------------------------------------------------------


@pytest.fixture
def event_loop_set():
    """pulumi.Output needs a current event loop; tests run earlier in the session may leave none."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def test_resources_mark_secrets_and_pickle_stateless_providers(monkeypatch, tc, event_loop_set):
    seen = {}

    def register(self, provider, name, props, opts=None):
        seen[name] = (provider, props, opts)

    monkeypatch.setattr(pulumi.dynamic.Resource, "__init__", register)
    TalosSecrets("s", cluster_name="t", endpoints=[ADDRESS], import_yaml="x")
    ConfigApply("c", address=ADDRESS, config="x", talosconfig=tc, role="controlplane")
    Bootstrap("b", address=ADDRESS, talosconfig=tc)
    Kubeconfig("k", address=ADDRESS, talosconfig=tc)
    ClusterHealth("h", address=ADDRESS, talosconfig=tc, control_plane_nodes=[ADDRESS])
    CaRotation("r", cluster_name="t", rotate_tokens={"talos": "1"}, secrets_yaml="x", retiring_yaml="",
               talosconfig=tc, nodes=[{"address": ADDRESS, "controlPlane": True}], k8s_endpoint=f"https://{ADDRESS}:6443")

    secret = {name: set(opts.additional_secret_outputs) for name, (_, _, opts) in seen.items()}
    assert secret == {
        "s": {"secretsYaml", "talosconfig", "importYaml", "retiringYaml"},
        "r": {"secretsYaml", "talosconfig", "retiringYaml"},
        "c": {"config", "talosconfig", "hubKubeconfig"},
        "b": {"talosconfig"},
        "k": {"kubeconfig", "talosconfig", "secretsYaml"},
        "h": {"talosconfig"},
    }
    for name, (provider, props, _) in seen.items():
        for key in secret[name] & set(props):
            assert props[key] is None or isinstance(props[key], pulumi.Output), (name, key)
        assert not vars(provider)  # stateless: the pickle in the state holds no credentials
        assert type(dill.loads(dill.dumps(provider, recurse=True))) is type(provider)


# --- the bounded wait ---------------------------------------------------------------------------


def test_wait_until_tries_at_least_once_stays_in_its_bound_and_names_the_last_observation():
    from kontinuum.talos.waits import NotYet, WaitTimeout, wait_until

    now = [0.0]
    tries = []

    def probe(left):
        tries.append(left)
        now[0] += 1.0  # every try takes a second
        raise NotYet(f"try {len(tries)}")

    with pytest.raises(WaitTimeout) as err:
        wait_until("the thing", probe, timeout=5, remedy="Do this.", clock=lambda: now[0],
                   sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert now[0] <= 5 + 1 and all(0 < left <= 5 for left in tries)
    assert str(err.value) == f"the thing: not reached within 5 s; last observation: try {len(tries)}. Do this."

    assert wait_until("x", lambda left: "ok", timeout=0, remedy="") == "ok"  # a spent bound still tries once
    with pytest.raises(ValueError):  # anything but NotYet ends the wait at once
        wait_until("x", lambda left: (_ for _ in ()).throw(ValueError("fatal")), timeout=5, remedy="")


def test_wait_until_starts_no_later_try_it_would_cut_to_a_fraction_of_a_second():
    """Seen in CI: a last try given 0.1 s timed out, and the wait reported "no answer within
    0.1 s" instead of what every try before it saw (the node's Kubernetes not ready)."""
    from kontinuum.talos.waits import NotYet, WaitTimeout, wait_until

    for timeout in (7.3, 10, 12.9):
        now, tries = [0.0], []

        def probe(left):
            tries.append(left)
            now[0] += min(left, 0.5)  # a try answers in 0.5 s, or times out at its budget
            raise NotYet("no answer" if left < 0.5 else "nodeReady")

        with pytest.raises(WaitTimeout) as err:
            wait_until("ready", probe, timeout=timeout, remedy="", clock=lambda: now[0],
                       sleep=lambda s: now.__setitem__(0, now[0] + s))
        assert min(tries) >= 1.0 and now[0] <= timeout
        assert err.value.last == "nodeReady"
