"""Run the pinned Pulumi engine non-interactively on a project, through tools/pulumi.

The wrapper owns the environment (file backend, PULUMI_HOME, no plugin downloads); this
module adds what a caller needs: an isolated state folder, a passphrase, a bounded run, and
JSON-parsed results.

With `config_file`, the stack's config lives in that file (the engine's `--config-file`) instead
of the project's stack config folder, so a test can run the repo's own project without writing
into its stacks/. `stack init` has no such flag: it runs in a scratch project of the same name
under the state folder, and the encryption salt it writes is carried into `config_file`.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from kontinuum import file_backend

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = ROOT / "tools" / "pulumi"
DEFAULT_TIMEOUT = 900.0
# Commands that take the engine's --config-file flag.
CONFIG_FILE_COMMANDS = ("up", "preview", "destroy", "refresh", "config", "import", "watch")


class PulumiError(RuntimeError):
    def __init__(self, args: list[str], result: subprocess.CompletedProcess):
        self.result = result
        out = (result.stdout or "")[-4000:]
        err = (result.stderr or "")[-4000:]
        super().__init__(f"pulumi {' '.join(args)} exited {result.returncode}\n--- stdout\n{out}\n--- stderr\n{err}")


@dataclass
class Stack:
    """One stack of one project, with its own state folder."""

    project_dir: Path
    name: str
    state_dir: Path
    passphrase: str
    extra_env: dict[str, str] | None = None
    config_file: Path | None = None  # the stack's config file, instead of <stackConfigDir>/Pulumi.<stack>.yaml

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            KONTINUUM_STATE=str(self.state_dir),
            PULUMI_CONFIG_PASSPHRASE=self.passphrase,
            PULUMI_HOME=str(self.state_dir / "pulumi-home"),
            PULUMI_BACKEND_URL=f"file://{self.state_dir / 'backend'}",
            # Test projects live outside the repo root but import its packages.
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        )
        env.update(self.extra_env or {})
        return env

    def command(self, *args: str) -> list[str]:
        """The full command line for `pulumi <args>` on this stack (run it with env(), in project_dir)."""
        argv = [str(WRAPPER), "--non-interactive", *args]
        if args and args[0] not in ("stack", "config", "login", "version", "plugin"):
            argv[2:3] = [args[0], "--stack", self.name]
        if self.config_file is not None and args and args[0] in CONFIG_FILE_COMMANDS:
            argv[3:3] = [f"--config-file={self.config_file}"]
        return argv

    def run(self, *args: str, timeout: float = DEFAULT_TIMEOUT, check: bool = True,
            stdin: str | None = None) -> subprocess.CompletedProcess:
        return self._run(self.command(*args), self.project_dir, args, timeout=timeout, check=check, stdin=stdin)

    def _run(self, argv: list[str], cwd: Path, args: tuple[str, ...], *, timeout: float, check: bool,
             stdin: str | None) -> subprocess.CompletedProcess:
        result = subprocess.run(
            argv, cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=timeout, input=stdin,
        )
        if check and result.returncode != 0:
            raise PulumiError(list(args), result)
        return result

    def init(self) -> "Stack":
        if self.config_file is None:
            self.run("stack", "init", self.name, "--secrets-provider", "passphrase")
            return self
        # `stack init` writes the passphrase's salt to <stackConfigDir>/Pulumi.<stack>.yaml and has
        # no --config-file: init from a scratch project of the same name, keep the salt.
        scratch = self.state_dir / "init-project"
        scratch.mkdir(parents=True, exist_ok=True)
        project = yaml.safe_load((self.project_dir / "Pulumi.yaml").read_text())
        (scratch / "Pulumi.yaml").write_text(yaml.safe_dump({"name": project["name"], "runtime": project["runtime"]}))
        args = ("stack", "init", self.name, "--secrets-provider", "passphrase")
        self._run([str(WRAPPER), "--non-interactive", *args], scratch, args, timeout=DEFAULT_TIMEOUT, check=True,
                  stdin=None)
        salt = yaml.safe_load((scratch / f"Pulumi.{self.name}.yaml").read_text())["encryptionsalt"]
        existing = yaml.safe_load(self.config_file.read_text()) if self.config_file.exists() else None
        self.write_config_file({**(existing or {}), "encryptionsalt": salt})
        return self

    def write_config_file(self, settings: dict) -> None:
        """Replace the stack's config file (config_file stacks only); keeps the encryption salt."""
        assert self.config_file is not None, "write_config_file needs a Stack with config_file"
        if "encryptionsalt" not in settings and self.config_file.exists():
            salt = (yaml.safe_load(self.config_file.read_text()) or {}).get("encryptionsalt")
            settings = {**settings, **({"encryptionsalt": salt} if salt else {})}
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(yaml.safe_dump(settings, sort_keys=False))

    def set_config(self, key: str, value: str, *, secret: bool = False) -> None:
        # The value goes through stdin: a secret never shows up in the process list.
        self.run("config", "set", "--stack", self.name, "--secret" if secret else "--plaintext", "--raw", key,
                 stdin=value)

    def up(self, *extra: str, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess:
        return self.run("up", "--yes", "--skip-preview", *extra, timeout=timeout)

    def preview(self, *extra: str, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess:
        return self.run("preview", *extra, timeout=timeout)

    def destroy(self, *extra: str, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess:
        return self.run("destroy", "--yes", "--skip-preview", *extra, timeout=timeout)

    def outputs(self, *, show_secrets: bool = False) -> dict:
        """`pulumi stack output --json`: read from the checkpoint file (secrets as "[secret]"), or
        through the CLI where secrets are to be shown or the state is not a readable file backend."""
        state = None if show_secrets else self._checkpoint()
        if state is not None:
            stacks = [r for r in state["deployment"].get("resources") or [] if r["type"] == "pulumi:pulumi:Stack"]
            return _masked(stacks[0].get("outputs") or {}) if stacks else {}
        args = ["stack", "output", "--stack", self.name, "--json"] + (["--show-secrets"] if show_secrets else [])
        return json.loads(self.run(*args).stdout or "{}")

    def export(self) -> dict:
        """`pulumi stack export`: the checkpoint file, or the CLI where that is not readable."""
        return self._checkpoint() or json.loads(self.run("stack", "export", "--stack", self.name).stdout)

    def _checkpoint(self) -> dict | None:
        """The stack's export read without the engine (kontinuum/file_backend.py), or None."""
        env = self.env()
        project = yaml.safe_load((self.project_dir / "Pulumi.yaml").read_text())["name"]
        try:
            return file_backend.checkpoint(env["PULUMI_BACKEND_URL"], project, self.name)
        except file_backend.NotReadable:
            return None


def _masked(value):
    """Secret values (the engine's signature object) shown as the CLI shows them without --show-secrets."""
    if isinstance(value, dict):
        if file_backend.is_secret(value):
            return "[secret]"
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def kill_strays(project_dir: Path, state_dir: Path | None = None) -> list[int]:
    """SIGKILL Pulumi plugin processes still working in `project_dir`. The engine starts its
    plugins in process groups of their own, so killing a `pulumi up` does not reach them; our
    launchers (tools/plugins) make them die with the engine, this is the safety net. With
    `state_dir`, only the plugins of that stack's runs (their KONTINUUM_STATE): test modules run
    side by side in one project directory, and another module's plugins are not strays."""
    root = str(Path(project_dir).resolve())
    mine = f"KONTINUUM_STATE={state_dir}".encode() if state_dir is not None else None
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0") if mine else []
        except OSError:
            continue
        plugin = any(b"pulumi-resource-" in a or b"pulumi-language-" in a or a == b"pulumi.dynamic" for a in argv)
        if mine is not None and mine not in environ:
            continue
        if plugin and (cwd == root or cwd.startswith(root + os.sep)):
            try:
                os.kill(int(entry.name), 9)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    return killed
