"""The stack configs `make bench` writes pass the program's own validation, so a figure is never
lost to a config the program refuses (a relative ACME CA path once failed every bench up)."""

from __future__ import annotations

from pathlib import Path

from bench import common, preview50
from kontinuum.stackconfig import validation
from lab.acme import ensure_ca


def kontinuum_keys(cfg: dict) -> dict:
    return {key.partition(":")[2]: value for key, value in cfg.items()}


def test_preview50_config_is_valid_from_any_directory(tools_bin, tmp_path, monkeypatch):  # tools_bin links the charts
    hub = tmp_path / "hub.kubeconfig"
    hub.write_text(preview50.dead_hub_kubeconfig())
    ensure_ca(tmp_path / "acme")
    monkeypatch.chdir(tmp_path)  # the bench project lives outside the repo
    cfg = preview50.stack_config(3, str(hub), tmp_path / "acme" / "ca.crt")
    result = validation.validate(kontinuum_keys(cfg), secret_keys=frozenset(), render=False)
    assert result.errors == [], result.message()
    assert len(result.stack.zones) == 3


def test_lab_defaults_name_the_given_acme_ca_and_absolute_charts(tools_bin, tmp_path):
    defaults = common.lab_addon_defaults(tmp_path / "ca.crt")
    assert defaults["kontinuum:hub"]["acme"]["caBundleFile"] == str(tmp_path / "ca.crt")
    addons = defaults["kontinuum:defaults"]["addons"]
    for path in (addons["cilium"]["chart"]["path"], addons["certManager"]["chart"]["path"],
                 addons["gatewayApi"]["source"]):
        assert Path(path).is_absolute() and Path(path).exists(), path
