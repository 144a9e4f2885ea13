"""Our plugin launchers (tools/plugins) die with the engine that started them, even when the
engine is SIGKILLed: real processes, a stand-in engine that starts the launcher as its child in
a process group of the plugin's own (as the engine does) and is then killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tools" / "plugins"

# The stand-in engine: starts argv[1:] in a new process group, prints the child's pid and
# its first line of output (a plugin's port), then waits to be killed.
ENGINE = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, process_group=0)
    print(child.pid, child.stdout.readline().decode().strip(), flush=True)
    time.sleep(300)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start_engine(argv: list[str], env: dict) -> tuple[subprocess.Popen, int, str]:
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, *argv], stdout=subprocess.PIPE, text=True, env=env)
    line = engine.stdout.readline().split()
    assert line, "the plugin never started"
    return engine, int(line[0]), " ".join(line[1:])


def gone_within(pid: int, seconds: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if not alive(pid):
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


@pytest.fixture
def env() -> dict:
    return {**os.environ, "PULUMI_PYTHON_CMD": sys.executable}


def test_dynamic_provider_host_dies_with_a_killed_engine(env):
    engine, plugin, port = start_engine([str(PLUGINS / "pulumi-resource-pulumi-python"), "127.0.0.1:1"], env)
    try:
        assert port.isdigit(), f"the dynamic provider host printed {port!r}, not its port"
        assert alive(plugin)
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait(timeout=10)
        took = gone_within(plugin, 5)
        assert took is not None, "the dynamic provider host outlived the engine by 5 s"
    finally:
        if alive(plugin):
            os.kill(plugin, signal.SIGKILL)


def test_kubernetes_plugin_launcher_execs_the_next_one_on_path_and_dies_with_the_engine(env, tmp_path):
    fake = tmp_path / "bin" / "pulumi-resource-kubernetes"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 4242\nexec sleep 300\n")
    fake.chmod(0o755)
    env = {**env, "PATH": f"{PLUGINS}:{fake.parent}:{env['PATH']}"}
    engine, plugin, port = start_engine([str(PLUGINS / "pulumi-resource-kubernetes")], env)
    try:
        assert port == "4242"
        # exec'd, not started: the engine's child becomes the plugin itself (the fake execs sleep)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{plugin}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
            assert time.monotonic() < deadline, "the launcher did not exec the plugin"
            time.sleep(0.05)
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait(timeout=10)
        assert gone_within(plugin, 5) is not None, "the kubernetes plugin outlived the engine by 5 s"
    finally:
        if alive(plugin):
            os.kill(plugin, signal.SIGKILL)


def test_kubernetes_plugin_launcher_without_the_pinned_plugin_says_what_to_do(env, tmp_path):
    env = {**env, "PATH": f"{PLUGINS}:/usr/bin:/bin"}
    result = subprocess.run([str(PLUGINS / "pulumi-resource-kubernetes")], env=env, capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 1
    assert "run `make tools` first" in result.stderr


def test_the_program_dies_with_its_language_host(env, tmp_path):
    """Our executor (tools/plugins/pulumi-language-python-exec) runs the upstream one named by
    KONTINUUM_PYTHON_EXECUTOR after arming the guard: here a stand-in that prints and sleeps."""
    upstream = tmp_path / "pulumi-language-python-exec"
    upstream.write_text("import sys, time\nprint(' '.join(sys.argv[1:]), flush=True)\ntime.sleep(300)\n")
    env = {**env, "KONTINUUM_PYTHON_EXECUTOR": str(upstream)}
    host, program, args = start_engine([sys.executable, str(PLUGINS / "pulumi-language-python-exec"),
                                        "--monitor", "127.0.0.1:1", "."], env)
    try:
        assert args == "--monitor 127.0.0.1:1 ."  # the upstream executor got the host's arguments
        os.kill(host.pid, signal.SIGKILL)
        host.wait(timeout=10)
        assert gone_within(program, 5) is not None, "the program outlived its language host by 5 s"
    finally:
        if alive(program):
            os.kill(program, signal.SIGKILL)
