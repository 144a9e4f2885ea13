"""Child processes the lab owns: started with a bounded lifetime, stopped by pid.

Every server the lab or a test starts must stop by itself even if its owner crashes, so
children get PR_SET_PDEATHSIG (they die with the thread that started them) and, for
detached lab daemons, an explicit time-to-live enforced by the supervisor.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Managed:
    """One started process: its name (for messages), argv, log file and handle."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> "Managed":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                preexec_fn=_die_with_parent,
            )
        except FileNotFoundError as e:
            raise RuntimeError(
                f"{self.name}: cannot start {self.argv[0]!r} ({e.strerror}); run `make tools` "
                "or put the tool directory on PATH"
            ) from None
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; only ever this pid."""
        if not self.running():
            return
        assert self.popen is not None
        self.popen.terminate()
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=grace)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL at once (the power went); only ever this pid."""
        if not self.running():
            return
        assert self.popen is not None
        self.popen.kill()
        self.popen.wait(timeout=timeout)


def wait_until(what: str, probe, timeout: float, interval: float = 0.2, on_fail=None, on_timeout=None):
    """Poll `probe()` until it returns a truthy value or `timeout` seconds pass.

    `probe` may raise; the last exception or falsy value is reported in the error so the
    caller learns what was last observed, not just that time ran out, with what `on_timeout()`
    says then (state worth reading only once).
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = value
        except Exception as e:  # noqa: BLE001 - the last observation is what we report
            last = e
        if on_fail is not None:
            on_fail()
        if time.monotonic() >= deadline:
            detail = f"; {on_timeout()}" if on_timeout is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}; last observation: {last!r}{detail}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
