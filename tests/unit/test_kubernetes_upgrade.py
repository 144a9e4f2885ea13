"""The Kubernetes upgrade's plan and step logic (kontinuum/lifecycle/kubernetes_upgrade.py):
the documented order, one component at a time through image-only patches of the live config,
skipping what already runs the target (resume), bounded waits naming node and component; the
preview's plan lines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml

from kontinuum.lifecycle import image_patch
from kontinuum.lifecycle import kubernetes_upgrade as ku
from kontinuum.talos.waits import WaitTimeout

OLD, NEW = "v1.35.4", "v1.35.5"


def config(version: str, control_plane: bool = True) -> str:
    doc = {"version": "v1alpha1", "machine": {"type": "controlplane" if control_plane else "worker",
                                              "kubelet": {"image": f"ghcr.io/siderolabs/kubelet:{version}"}},
           "cluster": {"clusterName": "z"}}
    if control_plane:
        doc["cluster"].update({"apiServer": {"image": f"registry.k8s.io/kube-apiserver:{version}"},
                               "controllerManager": {"image": f"registry.k8s.io/kube-controller-manager:{version}"},
                               "scheduler": {"image": f"registry.k8s.io/kube-scheduler:{version}"}})
    return yaml.safe_dump_all([doc, {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "hostname": "x"}])


def nodes() -> list[ku.Node]:
    return [ku.Node("w1", "127.0.47.14", False, config(NEW, False)),
            ku.Node("cp1", "127.0.47.11", True, config(NEW)),
            ku.Node("cp2", "127.0.47.12", True, config(NEW)),
            ku.Node("w2", "127.0.47.15", False, config(NEW, False))]


def test_plan_is_control_planes_one_by_one_then_kubelets_control_planes_first():
    steps = ku.plan(nodes())
    assert [(s.node.name, s.phase) for s in steps] == [
        ("cp1", ku.STATIC_PODS), ("cp2", ku.STATIC_PODS),
        ("cp1", ku.KUBELETS), ("cp2", ku.KUBELETS), ("w1", ku.KUBELETS), ("w2", ku.KUBELETS)]
    assert steps[0].components == ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    assert steps[-1].components == ("kubelet",)


def test_plan_lines_name_step_node_components_and_versions():
    lines = ku.plan_lines(ku.plan(nodes()), OLD, NEW)
    assert lines[0] == ("Kubernetes upgrade, step 1/6: cp1 (127.0.47.11) kube-apiserver, kube-controller-manager, "
                        "kube-scheduler v1.35.4 → v1.35.5")
    assert lines[5] == "Kubernetes upgrade, step 6/6: w2 (127.0.47.15) kubelet v1.35.4 → v1.35.5"


@pytest.mark.parametrize("image,version,expect", [
    ("registry.k8s.io/kube-apiserver:v1.35.4", "1.35.5", "registry.k8s.io/kube-apiserver:v1.35.5"),
    ("localhost:5000/kube-apiserver", "v1.35.5", "localhost:5000/kube-apiserver:v1.35.5"),
    ("r.io/k@sha256:" + "0" * 64, "v1.36.0", "r.io/k:v1.36.0"),
])
def test_with_tag(image, version, expect):
    assert ku.with_tag(image, version) == expect
    assert ku.tag_of(expect) == "v" + version.removeprefix("v")


# --- run_step against a fake cluster: a node's pods follow the config it was last sent ------------


def images(text: str) -> dict[str, str]:
    return {c: i for c in image_patch.IMAGE_PATHS if (i := image_patch.image_in(text, c))}


class FakeCluster:
    """Talos nodes (live config served, ApplyConfiguration recorded) whose kubelet shows the last
    applied config at once (or never, for `stuck` components), read through a CoreV1Api-shaped
    object; each static pod's config-version goes up when its image changes."""

    def __init__(self, running: dict[str, str], stuck: set[str] = frozenset(), ready: bool = True):
        self.configs = {n.address: config(running.get(n.name, OLD), n.control_plane) for n in nodes()}
        self.applied: list[tuple[str, dict[str, str]]] = []
        self.modes: list[str] = []
        self.stuck = stuck
        self.ready = ready
        self.versions: dict[tuple[str, str], int] = {}

    def client_for(self, address):
        def apply_config(data, mode):
            self.modes.append(mode)
            before, after = images(self.configs[address]), images(data)
            self.applied.append((address, {c: ku.tag_of(i) for c, i in after.items() if before.get(c) != i}))
            for c, i in after.items():
                if before.get(c) != i and c not in self.stuck:
                    self.versions[(address, c)] = self.versions.get((address, c), 1) + 1
            for c in self.stuck & set(after):
                data = image_patch.with_image(data, c, before[c])
            self.configs[address] = data
        return SimpleNamespace(apply_config=apply_config, address=address,
                               machine_config=lambda: self.configs[address])

    def _ready(self):
        return [SimpleNamespace(type="Ready", status="True" if self.ready else "False", reason=None)]

    def list_namespaced_pod(self, namespace, label_selector, _request_timeout):
        component = label_selector.split("=", 1)[1]
        pods = []
        for address, text in self.configs.items():
            image = ku.target_images(text).get(component)
            if image and "controlplane" in text:
                version = str(self.versions.get((address, component), 1))
                pods.append(SimpleNamespace(
                    metadata=SimpleNamespace(name=f"{component}-{address}", deletion_timestamp=None,
                                             annotations={ku.CONFIG_VERSION: version}),
                    spec=SimpleNamespace(containers=[SimpleNamespace(name=component, image=image)]),
                    status=SimpleNamespace(host_ip=address, conditions=self._ready())))
        return SimpleNamespace(items=pods)

    def list_node(self, _request_timeout):
        return SimpleNamespace(items=[SimpleNamespace(
            metadata=SimpleNamespace(name=address),
            status=SimpleNamespace(addresses=[SimpleNamespace(address=address, type="InternalIP")],
                                   node_info=SimpleNamespace(kubelet_version=ku.tag_of(ku.target_images(t)["kubelet"])),
                                   conditions=self._ready())) for address, t in self.configs.items()])


def ctx(fake: FakeCluster, timeout: float = 2.0, settle_unready: bool = True, sync_manifests: bool = False) -> ku.Context:
    # The manifest sync needs a cluster API: tests/integration/test_kubernetes_upgrade_lab.py has it.
    return ku.Context(client_for=fake.client_for, core=fake, log=lambda m: None, timeout=timeout,
                      settle_unready=settle_unready, sync_manifests=sync_manifests)


@pytest.fixture(autouse=True)
def pulls(monkeypatch):
    """Every pre-pull (node address, image, namespace) the rollout asks for; a node listed in
    `pulls.unimplemented` answers Unimplemented, an image in `pulls.missing` is not found."""
    from kontinuum.talos.errors import TalosApiError

    made = SimpleNamespace(calls=[], unimplemented=set(), missing=set())

    def pre_pull(client, image, *, namespace, timeout):
        assert timeout > 0
        made.calls.append((client.address, image, namespace))
        if image in made.missing:
            raise TalosApiError(client.address, "image-pull", f"NOT_FOUND: failed to pull image {image}")
        return client.address not in made.unimplemented

    monkeypatch.setattr(ku.lifecycle, "pre_pull", pre_pull)
    return made


def test_rollout_moves_one_component_of_one_node_at_a_time_in_order():
    fake = FakeCluster({})
    result = ku.rollout(ctx(fake), ku.plan(nodes()), NEW)
    assert fake.applied == [
        ("127.0.47.11", {"kube-apiserver": NEW}), ("127.0.47.11", {"kube-controller-manager": NEW}),
        ("127.0.47.11", {"kube-scheduler": NEW}),
        ("127.0.47.12", {"kube-apiserver": NEW}), ("127.0.47.12", {"kube-controller-manager": NEW}),
        ("127.0.47.12", {"kube-scheduler": NEW}),
        ("127.0.47.11", {"kubelet": NEW}), ("127.0.47.12", {"kubelet": NEW}),
        ("127.0.47.14", {"kubelet": NEW}), ("127.0.47.15", {"kubelet": NEW})]
    assert result["cp1"] == {"kube-apiserver": NEW, "kube-controller-manager": NEW, "kube-scheduler": NEW, "kubelet": NEW}
    assert result["w2"] == {"kubelet": NEW}


def test_a_resumed_rollout_skips_what_already_runs_the_target():
    fake = FakeCluster({"cp1": NEW})  # a killed run had finished cp1 entirely
    ku.rollout(ctx(fake), ku.plan(nodes()), NEW)
    assert [a for a, _ in fake.applied] == ["127.0.47.12"] * 3 + ["127.0.47.12", "127.0.47.14", "127.0.47.15"]
    fake.applied.clear()
    ku.rollout(ctx(fake), ku.plan(nodes()), NEW)
    assert fake.applied == []  # a second run is a no-op


def test_a_component_that_does_not_converge_stops_the_rollout_naming_node_and_component():
    fake = FakeCluster({}, stuck={"kube-controller-manager"})
    with pytest.raises(WaitTimeout) as err:
        ku.rollout(ctx(fake, timeout=0.5), ku.plan(nodes()), NEW)
    assert ("kube-controller-manager on cp1 (127.0.47.11) to run registry.k8s.io/kube-controller-manager:v1.35.5, "
            "with a config version other than 1 and be Ready") in str(err.value)
    assert "runs registry.k8s.io/kube-controller-manager:v1.35.4 (config version 1)" in str(err.value)
    assert [a for a, _ in fake.applied] == ["127.0.47.11", "127.0.47.11"]  # nothing after it


def test_a_component_on_the_target_is_never_applied_again():
    """Not Ready but on the target: during an upgrade (a killed run changed it) the rollout waits
    for it without applying it; when the record is new (a zone made before it) nothing is due."""
    everything_new = {n.name: NEW for n in nodes()}
    fake = FakeCluster(everything_new, ready=False)
    with pytest.raises(WaitTimeout) as err:
        ku.rollout(ctx(fake, timeout=0.3), ku.plan(nodes()), NEW)
    assert "kube-apiserver on cp1 (127.0.47.11) to run registry.k8s.io/kube-apiserver:v1.35.5 and be Ready" in str(err.value)
    assert fake.applied == []
    ku.rollout(ctx(fake, settle_unready=False), ku.plan(nodes()), NEW)
    assert fake.applied == []


def test_prepull_comes_first_in_talosctls_order_namespaces_and_only_for_what_changes(pulls):
    fake = FakeCluster({"cp1": NEW})  # cp1 runs the target already: nothing to pull there
    ku.rollout(ctx(fake), ku.plan(nodes()), NEW)
    cri = [(a, i.rsplit("/", 1)[1]) for a, i, ns in pulls.calls if ns == "cri"]
    system = [(a, i.rsplit("/", 1)[1]) for a, i, ns in pulls.calls if ns == "system"]
    assert cri == [("127.0.47.12", f"{c}:{NEW}") for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")]
    assert system == [(a, f"kubelet:{NEW}") for a in ("127.0.47.12", "127.0.47.14", "127.0.47.15")]
    assert [ns for _, _, ns in pulls.calls] == ["cri"] * 3 + ["system"] * 3  # every pull before the first apply
    pulls.calls.clear()
    ku.rollout(ctx(fake), ku.plan(nodes()), NEW)
    assert pulls.calls == []  # nothing left to change: nothing to pull


def test_a_failed_pull_stops_the_rollout_before_any_node_changes_naming_node_and_image(pulls):
    pulls.missing.add(f"ghcr.io/siderolabs/kubelet:{NEW}")
    fake = FakeCluster({})
    with pytest.raises(ku.KubernetesUpgradeError) as err:
        ku.rollout(ctx(fake), ku.plan(nodes()), NEW)
    assert f"cp1 (127.0.47.11) could not pull ghcr.io/siderolabs/kubelet:{NEW}" in str(err.value)
    assert "This run changed no node" in str(err.value)
    assert fake.applied == []


def test_a_node_without_the_pull_api_is_skipped_as_talosctl_does(pulls):
    pulls.unimplemented.add("127.0.47.14")
    fake = FakeCluster({})
    ku.rollout(ctx(fake), ku.plan(nodes()), NEW)
    assert ("127.0.47.14", f"ghcr.io/siderolabs/kubelet:{NEW}", "system") in pulls.calls
    assert len(fake.applied) == 10  # the rollout went on


def test_proxy_image_only_when_kube_proxy_is_enabled():
    doc, other = yaml.safe_load_all(config(NEW))
    doc["cluster"]["proxy"] = {"disabled": True, "image": f"registry.k8s.io/kube-proxy:{NEW}"}
    assert ku.proxy_image(yaml.safe_dump_all([doc, other])) is None
    doc["cluster"]["proxy"]["disabled"] = False
    assert ku.proxy_image(yaml.safe_dump_all([doc, other])) == f"registry.k8s.io/kube-proxy:{NEW}"


# --- the provider's diff: the plan at preview, the skew refused -------------------------------------


def test_preview_logs_the_plan_and_refuses_a_skipped_minor(monkeypatch):
    from kontinuum.errors import ConfigError
    from providers import kubernetes_version as kv

    lines: list[str] = []
    monkeypatch.setattr(kv, "info", lines.append)
    news = {"zone": "z", "version": NEW, "configPath": "zones[0]",
            "nodes": [{"name": "cp1", "address": "127.0.47.11", "role": "controlplane", "pool": "cp"},
                      {"name": "w1", "address": "127.0.47.14", "role": "worker", "pool": "web"}],
            "configs": {"cp": config(NEW), "web": config(NEW, False)}}
    assert kv.diff_kubernetes_version({"version": OLD, "zone": "z", "configPath": "zones[0]"}, news).changes
    assert lines == ["Kubernetes upgrade, step 1/3: cp1 (127.0.47.11) kube-apiserver, kube-controller-manager, "
                     "kube-scheduler v1.35.4 → v1.35.5",
                     "Kubernetes upgrade, step 2/3: cp1 (127.0.47.11) kubelet v1.35.4 → v1.35.5",
                     "Kubernetes upgrade, step 3/3: w1 (127.0.47.14) kubelet v1.35.4 → v1.35.5"]
    same = kv.diff_kubernetes_version({"version": NEW, "zone": "z", "configPath": "zones[0]"},
                                      {**news, "configs": {"cp": "changed"}})
    assert not same.changes  # another config change is ConfigApply's, not a rollout
    with pytest.raises(ConfigError) as err:
        kv.diff_kubernetes_version({"version": "v1.34.2"}, {**news, "version": "v1.36.0"})
    assert "zones[0].kubernetesVersion" in str(err.value) and "one minor at a time" in str(err.value)


# --- image-only patches of the live config ----------------------------------------------------------


def with_pending_change(text: str) -> str:
    """A target config that also carries a change unrelated to the upgrade (ConfigApply's)."""
    docs = list(yaml.safe_load_all(text))
    docs[0]["machine"]["nodeLabels"] = {"pending": "change"}
    docs[0]["cluster"]["proxy"] = {"image": f"registry.k8s.io/kube-proxy:{NEW}"}
    return yaml.safe_dump_all(docs)


def test_each_step_sends_the_live_config_with_only_that_image_in_no_reboot_mode(monkeypatch):
    monkeypatch.setattr(ku, "sync_manifests", lambda ctx, steps: [])  # needs a cluster API: the lab tests have it
    fake = FakeCluster({})
    live_before = dict(fake.configs)
    targets = [ku.Node(n.name, n.address, n.control_plane, with_pending_change(n.config), "p") for n in nodes()]
    ku.rollout(ctx(fake, sync_manifests=True), ku.plan(targets), NEW)
    assert set(fake.modes) == {"no-reboot"}
    for address, live in fake.configs.items():
        assert "pending" not in live  # the other change did not ride along
        expected = live_before[address].replace(OLD, NEW)
        if "controlplane" in live:  # kube-proxy's image on control planes only (talosctl's phase 3)
            expected = image_patch.with_image(expected, "kube-proxy", f"registry.k8s.io/kube-proxy:{NEW}")
        assert live == expected
    proxies = [i for i, (_, changed) in enumerate(fake.applied) if changed == {"kube-proxy": NEW}]
    kubelets = [i for i, (_, changed) in enumerate(fake.applied) if "kubelet" in changed]
    assert len(proxies) == 2 and max(proxies) < min(kubelets)  # after the static pods, before the kubelets


def test_a_no_reboot_refusal_stops_the_rollout_naming_the_node():
    from kontinuum.talos.errors import TalosApiError

    fake = FakeCluster({})
    plain = fake.client_for

    def client_for(address):
        c = plain(address)

        def refuse(data, mode):
            raise TalosApiError(address, "apply-config",
                                "INVALID_ARGUMENT: this config change can't be applied in immediate mode")
        return SimpleNamespace(apply_config=refuse, address=address, machine_config=c.machine_config)

    fake.client_for = client_for
    with pytest.raises(image_patch.ImagePatchError) as err:
        ku.rollout(ctx(fake), ku.plan(nodes()), NEW)
    text = str(err.value)
    assert "cp1 (127.0.47.11) refused its live config with only kube-apiserver set to" in text
    assert "Talos says the change needs a reboot" in text and "Nothing after this node was touched" in text
