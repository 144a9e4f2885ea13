"""tools/plugins/host-python, the language host's Python: `-m pip list -v --format json` answers
exactly what pip answers (pip_list.py, without pip's command machinery), and every other call is
the interpreter the engine named, with the same arguments and environment."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PLUGINS = ROOT / "tools" / "plugins"
PYTHON = ROOT / "venv" / "bin" / "python"
PIP_LIST = ["-m", "pip", "list", "-v", "--format", "json"]


def pip_list_module():
    spec = importlib.util.spec_from_file_location("pip_list", PLUGINS / "pip_list.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(argv: list[str], env: dict, cwd: Path) -> str:
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def both(env: dict, cwd: Path) -> tuple[str, str]:
    """(host-python's answer, pip's own) to the host's command."""
    ours = run([str(PLUGINS / "host-python"), *PIP_LIST], {**env, "KONTINUUM_HOST_PYTHON": str(PYTHON)}, cwd)
    return ours, run([str(PYTHON), *PIP_LIST], env, cwd)


def dist(site: Path, dirname: str, metadata: str, installer: str | None = "pip\n") -> None:
    d = site / dirname
    d.mkdir(parents=True)
    (d / ("PKG-INFO" if dirname.endswith(".egg-info") else "METADATA")).write_text(metadata)
    if installer is not None:
        (d / "INSTALLER").write_text(installer)


@pytest.fixture
def extra(tmp_path) -> Path:
    """A folder on PYTHONPATH with the cases pip's rules decide: a shadowing name, an unnormalized
    version, a skipped and an invalid name, an egg-info, no INSTALLER, a padded one."""
    site = tmp_path / "extra"
    dist(site, "pulumi-99.0.dist-info", "Metadata-Version: 2.1\nName: pulumi\nVersion: 99.0\n")  # shadows the venv's
    dist(site, "Foo_Bar-1.0.0_alpha.dist-info", "Metadata-Version: 2.1\nName: Foo_Bar\nVersion: 1.0.0-Alpha\n",
         installer="\n  custom  \n")
    dist(site, "argparse-1.4.0.dist-info", "Metadata-Version: 2.1\nName: argparse\nVersion: 1.4.0\n")
    dist(site, "~roken-1.0.dist-info", "Metadata-Version: 2.1\nName: ~roken\nVersion: 1.0\n")
    dist(site, "legacy_pkg-2.0.egg-info", "Metadata-Version: 1.0\nName: legacy-pkg\nVersion: 2.0\n", installer=None)
    return site


def test_the_venv_is_listed_as_pip_lists_it(tmp_path):
    ours, pips = both(dict(os.environ), ROOT)
    assert ours == pips
    assert any(p["name"] in ("pulumi_kubernetes", "pulumi-kubernetes") for p in json.loads(ours))


def test_pips_rules_are_followed_without_pip(tmp_path, extra):
    env = {**os.environ, "PYTHONPATH": str(extra)}
    (tmp_path / "cwd" / "cwd_pkg-1.0.dist-info").mkdir(parents=True)  # pip leaves the working directory out
    (tmp_path / "cwd" / "cwd_pkg-1.0.dist-info" / "METADATA").write_text("Name: cwd-pkg\nVersion: 1.0\n")
    ours, pips = both(env, tmp_path / "cwd")
    assert ours == pips
    listed = {p["name"]: p for p in json.loads(ours)}
    assert listed["pulumi"]["version"] == "99.0" and listed["Foo_Bar"]["version"] == "1.0.0a0"
    assert listed["Foo_Bar"]["installer"] == "custom" and listed["legacy-pkg"]["installer"] == ""
    assert "argparse" not in listed and "~roken" not in listed and "cwd-pkg" not in listed
    # and the answer was pip_list.py's own, not the real pip it hands over to
    path = json.loads(run([str(PYTHON), "-c", "import sys, json; print(json.dumps(sys.path[1:]))"], env, tmp_path))
    assert pip_list_module().listing(path) == json.loads(pips)


def test_what_it_does_not_model_is_answered_by_pip(tmp_path, extra):
    (extra / "dev.egg-link").write_text(f"{tmp_path}\n.\n")
    env = {**os.environ, "PYTHONPATH": str(extra)}
    ours, pips = both(env, tmp_path)
    assert ours == pips
    path = json.loads(run([str(PYTHON), "-c", "import sys, json; print(json.dumps(sys.path[1:]))"], env, tmp_path))
    module = pip_list_module()
    with pytest.raises(module.Unmodelled):
        module.listing(path)


def test_every_other_call_is_the_engines_interpreter_unchanged(tmp_path):
    probe = ["-c", "import json, os, sys; print(json.dumps([sys.argv, sys.executable, os.getcwd(), "
                   "os.environ.get('PULUMI_PYTHON_CMD'), 'KONTINUUM_HOST_PYTHON' in os.environ]))", "a b", ""]
    env = {**os.environ, "PULUMI_PYTHON_CMD": str(PYTHON)}
    direct = run([str(PYTHON), *probe], env, tmp_path)
    via = run([str(PLUGINS / "host-python"), *probe],
              {**env, "PULUMI_PYTHON_CMD": str(PLUGINS / "host-python"), "KONTINUUM_HOST_PYTHON": str(PYTHON)}, tmp_path)
    assert via == direct
    # pip with other arguments is pip itself (here: a list without -v has no location)
    plain = json.loads(run([str(PLUGINS / "host-python"), "-m", "pip", "list", "--format", "json"],
                           {**env, "KONTINUUM_HOST_PYTHON": str(PYTHON)}, tmp_path))
    assert plain and "location" not in plain[0]


def test_the_language_hosts_default_python_when_the_engine_names_none(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PULUMI_PYTHON_CMD", "KONTINUUM_HOST_PYTHON")}
    env["PATH"] = f"{PYTHON.parent}:{env['PATH']}"
    out = run([str(PLUGINS / "host-python"), "-c", "import os, sys; print(sys.executable, 'PULUMI_PYTHON_CMD' in os.environ)"],
              env, tmp_path)
    assert out.split() == [str(PYTHON.parent / "python3"), "False"]
