"""The stack-config contract through the real engine: `pulumi preview` of a bad stack config
fails before a single resource is registered, with every problem named by its exact path, no
traceback and no warnings; a config that lost every zone is refused by preview and up."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import yaml

from lab.pulumi_cli import Stack

ROOT = Path(__file__).parents[2]
LAB_STACK = ROOT / "stacks" / "Pulumi.lab.yaml"
GUARD_PROJECT = Path(__file__).parent / "projects" / "region_guard"


def _text(result) -> str:
    return (result.stdout or "") + (result.stderr or "")


def test_preview_of_a_bad_stack_config_fails_before_registering_anything(tmp_path):
    cfg = yaml.safe_load(LAB_STACK.read_text())["config"]
    # Nothing listens on these addresses, and nothing may be dialled: the check comes first.
    cfg["kontinuum:hubKubeconfigFile"] = str(tmp_path / "no-hub.yaml")
    cfg["kontinuum:zones"] = [
        {"zone": "a", "talosAddresses": ["127.0.10.250"],
         "controlPlane": {"patches": [[{"op": "remove", "path": "/machine/nope"}]]}},
        {"zone": "b", "talosAddresses": ["127.0.10.251"], "kubernetesVersion": "v1.30.1"},
        {"zone": "c", "talosAddresses": ["127.0.10.252"], "talosVerison": "v1.13.0"},
    ]
    cfg["kontinuum:zone"] = []
    stack = Stack(ROOT, "badcfg", tmp_path / "state", passphrase="e2e-config",
                  config_file=tmp_path / "Pulumi.badcfg.yaml").init()
    stack.write_config_file({"config": cfg})
    started = time.monotonic()
    result = stack.run("preview", check=False, timeout=300)
    out = _text(result)
    assert result.returncode != 0
    for expected in [
        "invalid stack config (kontinuum:…):",
        "kontinuum:zone: unknown key; did you mean kontinuum:zones?",
        "zones[1].kubernetesVersion: Kubernetes v1.30.1 is not supported by Talos v1.13.0 (supported: 1.31–1.36)",
        "zones[2].talosVerison: unknown key; did you mean talosVersion?",
        "zones[0].controlPlane.patches[0][0]: remove failed: /machine/nope: 'nope' does not exist "
        "(zone a, pool controlplane, node 127.0.10.250)",
    ]:
        assert expected in out, out
    assert "Traceback" not in out and "warning:" not in out and "non-zero exit code" not in out, out
    # Only the stack itself; no Zone, Instance, guard or provider was registered.
    assert "kontinuum:" not in out.split("Resources:")[-1] and "RegionGuard" not in out and "Zone" not in out
    print(f"preview of a bad config failed in {time.monotonic() - started:.1f}s")


def test_an_emptied_region_is_refused_until_the_switch(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(GUARD_PROJECT, project)
    stack = Stack(project, "guard", tmp_path / "state", passphrase="e2e-guard").init()
    stack.set_config("zones", '["a", "b"]')
    up = stack.up()
    assert "warning:" not in _text(up), _text(up)  # plugins from the engine's plugin dir, not $PATH

    stack.set_config("zones", '["a"]')
    assert stack.up().returncode == 0  # removing some zones is a normal up

    stack.set_config("zones", "[]")
    for result in (stack.run("preview", check=False), stack.run("up", "--yes", "--skip-preview", check=False)):
        out = _text(result)
        assert result.returncode != 0
        assert "region eu: kontinuum:zones is empty, but the region still has zone a" in out, out
        assert "`pulumi destroy`" in out and "kontinuum:allowEmptyRegion: true" in out
        assert "Traceback" not in out
    assert stack.export()["deployment"]["resources"][-1]["inputs"]["zones"] == ["a"]  # nothing changed

    stack.set_config("allowEmpty", "true")
    assert stack.up().returncode == 0
    assert stack.destroy().returncode == 0


def test_a_plain_text_hub_kubeconfig_is_refused_with_the_command(tmp_path):
    cfg = yaml.safe_load(LAB_STACK.read_text())["config"]
    del cfg["kontinuum:hubKubeconfigFile"]
    cfg["kontinuum:zones"] = [{"zone": "a", "talosAddresses": ["127.0.10.250"]}]
    stack = Stack(ROOT, "plainhub", tmp_path / "state", passphrase="e2e-config",
                  config_file=tmp_path / "Pulumi.plainhub.yaml").init()
    stack.write_config_file({"config": cfg})
    stack.set_config("kontinuum:hubKubeconfig", "apiVersion: v1\nkind: Config\n")
    out = _text(stack.run("preview", check=False, timeout=300))
    assert ("kontinuum:hubKubeconfig: is plain text in the stack config; store it as a secret: "
            "`pulumi config rm kontinuum:hubKubeconfig` then "
            "`pulumi config set --secret kontinuum:hubKubeconfig < hub-kubeconfig.yaml`") in out, out
    assert "apiVersion" not in out and "Traceback" not in out

    stack.set_config("kontinuum:hubKubeconfig", "apiVersion: v1\nkind: Config\n", secret=True)
    out = _text(stack.run("preview", check=False, timeout=300))
    assert "is plain text" not in out and "invalid stack config" not in out, out


def test_an_error_of_ours_while_registering_is_its_message_alone(tmp_path):
    cfg = yaml.safe_load(LAB_STACK.read_text())["config"]
    cfg["kontinuum:hubKubeconfigFile"] = str(tmp_path / "no-hub.yaml")
    # Fetched when the zone registers; nothing listens there (refused at once, loopback only).
    cfg["kontinuum:defaults"]["addons"]["gatewayApi"]["source"] = "https://127.0.0.1:1/standard-install.yaml"
    cfg["kontinuum:zones"] = [{"zone": "a", "talosAddresses": ["127.0.10.250"]}]
    stack = Stack(ROOT, "fetch", tmp_path / "state", passphrase="e2e-config", config_file=tmp_path / "Pulumi.fetch.yaml",
                  extra_env={"KONTINUUM_CACHE": str(tmp_path / "cache")}).init()
    stack.write_config_file({"config": cfg})
    out = _text(stack.run("preview", check=False, timeout=300))
    assert "https://127.0.0.1:1/standard-install.yaml: cannot download" in out, out
    assert "Traceback" not in out and "non-zero exit code" not in out, out
