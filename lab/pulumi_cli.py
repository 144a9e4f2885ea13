"""Run the pinned Pulumi engine non-interactively on a project, through tools/pulumi.

The wrapper owns the environment (file backend, PULUMI_HOME, no plugin downloads); this
module adds what a caller needs: an isolated state folder, a passphrase, a bounded run, and
JSON-parsed results.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = ROOT / "tools" / "pulumi"
DEFAULT_TIMEOUT = 900.0


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

    def run(self, *args: str, timeout: float = DEFAULT_TIMEOUT, check: bool = True,
            stdin: str | None = None) -> subprocess.CompletedProcess:
        argv = [str(WRAPPER), "--non-interactive", *args]
        if args and args[0] not in ("stack", "config", "login", "version", "plugin"):
            argv[2:3] = [args[0], "--stack", self.name]
        result = subprocess.run(
            argv, cwd=self.project_dir, env=self.env(), capture_output=True, text=True, timeout=timeout,
            input=stdin,
        )
        if check and result.returncode != 0:
            raise PulumiError(list(args), result)
        return result

    def init(self) -> "Stack":
        self.run("stack", "init", self.name, "--secrets-provider", "passphrase")
        return self

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
        args = ["stack", "output", "--stack", self.name, "--json"] + (["--show-secrets"] if show_secrets else [])
        return json.loads(self.run(*args).stdout or "{}")

    def export(self) -> dict:
        return json.loads(self.run("stack", "export", "--stack", self.name).stdout)
