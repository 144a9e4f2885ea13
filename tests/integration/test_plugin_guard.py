"""Our plugin launchers (tools/plugins) die with the engine that started them, even when the
engine is SIGKILLed: real processes, a stand-in engine that starts the launcher as its child in
a process group of the plugin's own (as the engine does) and is then killed. The Go plugins run
under kontinuum-plugin-guard (the tool directory's), the dynamic-provider host under
plugin_guard.py; the pinned language host still finds the pinned kubernetes plugin."""

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


@pytest.fixture(scope="module")
def tool_dir() -> Path:
    """The tool directory with the guard (the pinned binaries may still be building)."""
    out = subprocess.run([str(ROOT / "tools" / "install.sh"), "--print-bin"], capture_output=True, text=True, check=True)
    path = Path(out.stdout.strip())
    if not (path / "kontinuum-plugin-guard").exists():
        pytest.fail(f"kontinuum-plugin-guard is missing from {path}; run `make tools`")
    return path


@pytest.fixture
def env(tool_dir) -> dict:
    return {**os.environ, "PULUMI_PYTHON_CMD": sys.executable}


def fake_plugin(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def wait_exec(pid: int, argv0: bytes) -> None:
    """Until the launcher's process has become `argv0` (exec'd, not started: same pid)."""
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] != argv0:
        assert time.monotonic() < deadline, "the launcher did not exec the plugin"
        time.sleep(0.05)


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


def test_kubernetes_plugin_launcher_execs_the_next_one_on_path_and_dies_with_the_engine(env, tool_dir, tmp_path):
    fake = fake_plugin(tmp_path / "bin", "pulumi-resource-kubernetes", "echo 4242 \"$TMPDIR\"\nexec sleep 300")
    env = {**env, "PATH": f"{PLUGINS}:{fake.parent}:{tool_dir}:{env['PATH']}", "TMPDIR": str(tmp_path)}
    engine, plugin, out = start_engine([str(PLUGINS / "pulumi-resource-kubernetes")], env)
    try:
        # the fake's port, and the engine's private temporary directory from the Go guard
        assert out == f"4242 {tmp_path}/kontinuum-plugins-{engine.pid}"
        wait_exec(plugin, b"sleep")  # sh → guard → the fake → sleep, all one process
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait(timeout=10)
        assert gone_within(plugin, 5) is not None, "the kubernetes plugin outlived the engine by 5 s"
    finally:
        if alive(plugin):
            os.kill(plugin, signal.SIGKILL)


def test_the_pinned_kubernetes_plugin_dies_with_a_killed_engine(env, tool_dir, tmp_path):
    real = tool_dir / "pulumi-resource-kubernetes"
    if not real.exists():
        pytest.fail(f"{real} is missing; run `make tools`")
    env = {**env, "PATH": f"{PLUGINS}:{tool_dir}:{env['PATH']}", "TMPDIR": str(tmp_path)}
    engine, plugin, port = start_engine([str(PLUGINS / "pulumi-resource-kubernetes"), "127.0.0.1:1"], env)
    try:
        assert port.isdigit(), f"the kubernetes plugin printed {port!r}, not its port"
        assert Path(f"/proc/{plugin}/exe").resolve() == real.resolve()  # the launcher and guard exec'd it
        assert f"TMPDIR={tmp_path}/kontinuum-plugins-{engine.pid}".encode() in Path(f"/proc/{plugin}/environ").read_bytes()
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait(timeout=10)
        assert gone_within(plugin, 5) is not None, "the kubernetes plugin outlived the engine by 5 s"
    finally:
        if alive(plugin):
            os.kill(plugin, signal.SIGKILL)


@pytest.mark.parametrize("missing", ["plugin", "guard"])
def test_kubernetes_plugin_launcher_without_the_pinned_plugin_or_guard_says_what_to_do(env, tool_dir, tmp_path,
                                                                                        missing):
    fake = fake_plugin(tmp_path / "bin", "pulumi-resource-kubernetes", "exit 0")
    guard_only = tmp_path / "guard"
    guard_only.mkdir()
    (guard_only / "kontinuum-plugin-guard").symlink_to(tool_dir / "kontinuum-plugin-guard")
    path = f"{PLUGINS}:{guard_only}:/usr/bin:/bin" if missing == "plugin" else f"{PLUGINS}:{fake.parent}:/usr/bin:/bin"
    result = subprocess.run([str(PLUGINS / "pulumi-resource-kubernetes")], env={**env, "PATH": path},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "run `make tools` first" in result.stderr


def test_language_host_launcher_runs_the_host_under_the_guard_with_our_executor_and_python(env, tool_dir, tmp_path):
    """The host gets our executor and host-python, which runs the interpreter the engine named."""
    fake = fake_plugin(tmp_path / "bin", "pulumi-language-python",
                       'echo "$PULUMI_PYTHON_CMD|$KONTINUUM_HOST_PYTHON|$*"\nexec sleep 300')
    env = {**env, "PATH": f"{PLUGINS}:{fake.parent}:{tool_dir}:{env['PATH']}"}
    engine, plugin, out = start_engine([str(PLUGINS / "pulumi-language-python"), "127.0.0.1:1"], env)
    try:
        assert out == (f"{PLUGINS}/host-python|{sys.executable}|"
                       f"-use-executor {PLUGINS}/pulumi-language-python-exec 127.0.0.1:1")
        wait_exec(plugin, b"sleep")
        os.kill(engine.pid, signal.SIGKILL)
        engine.wait(timeout=10)
        assert gone_within(plugin, 5) is not None, "the language host outlived the engine by 5 s"
    finally:
        if alive(plugin):
            os.kill(plugin, signal.SIGKILL)


def required_plugins(launcher: list[str], env: dict, *, guarded: bool = True) -> list[tuple[str, str, str]]:
    """GetRequiredPlugins of the pinned language host started by `launcher` (under a stand-in
    engine), asked from the repo root, where the project's venv is the program's Python."""
    import grpc
    from pulumi.runtime.proto import language_pb2, language_pb2_grpc

    engine = subprocess.Popen([sys.executable, "-c", ENGINE, *launcher, "127.0.0.1:1"], stdout=subprocess.PIPE,
                              text=True, env=env, cwd=ROOT)
    try:
        pid, port = engine.stdout.readline().split()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = language_pb2_grpc.LanguageRuntimeStub(channel)
            reply = stub.GetRequiredPlugins(language_pb2.GetRequiredPluginsRequest(project="kontinuum", pwd=str(ROOT),
                                                                                  program="."), timeout=60)
        return sorted((p.name, p.kind, p.version) for p in reply.plugins)
    finally:
        engine.kill()
        engine.wait(timeout=10)
        if gone_within(int(pid), 5 if guarded else 0) is None:
            os.kill(int(pid), signal.SIGKILL)
            assert not guarded, "the language host outlived its killed engine by 5 s"


def test_the_pinned_language_host_finds_the_pinned_kubernetes_plugin_through_our_launcher(env, tool_dir):
    """The host's plugin discovery (`pip list`, answered by tools/plugins/pip_list.py through
    host-python) names the kubernetes plugin at the pinned version, as the host does with pip."""
    host = tool_dir / "pulumi-language-python"
    if not host.exists():
        pytest.fail(f"{host} is missing; run `make tools`")
    pins = dict(line.split("=", 1) for line in (ROOT / "tools" / "versions.env").read_text().splitlines()
                if line[:1].isupper())
    env = {**env, "PATH": f"{PLUGINS}:{tool_dir}:{env['PATH']}", "PULUMI_PYTHON_CMD": str(ROOT / "venv" / "bin" / "python")}
    ours = required_plugins([str(PLUGINS / "pulumi-language-python")], env)
    assert ("kubernetes", "resource", f"v{pins['PULUMI_KUBERNETES_VERSION']}") in ours
    # the host alone (its own `python -m pip list`, no launcher) says the same
    assert required_plugins([str(host)], env, guarded=False) == ours


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
