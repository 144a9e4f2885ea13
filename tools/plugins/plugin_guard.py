"""Plugins die with the engine that started them.

The engine starts each plugin in a process group of its own, so a CI runner that SIGKILLs
`pulumi up` (its whole process group) leaves the plugins running, each holding its memory
for as long as it likes. This guard runs in the plugin's own process, before the plugin:

- it asks the kernel for SIGKILL when the parent (the engine) dies (PR_SET_PDEATHSIG; kept
  across exec, so it covers a Go plugin we exec as well as the Python one);
- it refuses to start when the engine is already gone (the signal would never come);
- for the Python dynamic-provider host, which stays in this interpreter, a thread also
  watches the parent pid and exits when it changes (a second way, in case the first one fails);
- an exec'd plugin gets a temporary directory of its engine's own (TMPDIR), removed by a later
  start once that engine is gone: pulumi-resource-kubernetes writes its kubeconfig (client keys)
  to a temporary file on every start and never removes it, thousands a day in /tmp otherwise.

Usage (from the launchers beside this file, with the engine's pid as the first argument):
  plugin_guard.py <engine-pid> exec <binary> [args...]   exec a binary under the guard
  plugin_guard.py <engine-pid> dynamic [args...]         run `python -m pulumi.dynamic`
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL = 1.0  # seconds between parent checks in the dynamic host
TMP_PREFIX = "kontinuum-plugins-"  # + the engine's pid


def die_with_parent(engine_pid: int) -> None:
    """Arm PR_SET_PDEATHSIG, then make sure the engine did not die before it was armed."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        sys.stderr.write(f"plugin_guard: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}\n")
    if os.getppid() != engine_pid:
        sys.stderr.write(f"plugin_guard: the engine (pid {engine_pid}) is gone; not starting\n")
        os._exit(1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def private_tmp(engine_pid: int, base: str | None = None) -> str:
    """A 0700 directory for the plugins of this engine; directories of engines that are gone
    (killed ones too, whose plugins could not clean up) are removed first."""
    base = base or tempfile.gettempdir()
    for name in os.listdir(base):
        pid = name[len(TMP_PREFIX):]
        if name.startswith(TMP_PREFIX) and pid.isdigit() and int(pid) != engine_pid and not alive(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    path = os.path.join(base, f"{TMP_PREFIX}{engine_pid}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def watch_parent(engine_pid: int, interval: float = WATCH_INTERVAL) -> threading.Thread:
    """A daemon thread that ends this process once its parent is no longer the engine."""
    def run() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != engine_pid:
                os._exit(0)

    thread = threading.Thread(target=run, name="plugin-guard", daemon=True)
    thread.start()
    return thread


def run_dynamic(args: list[str]) -> None:
    """What `python -m pulumi.dynamic` does, in this interpreter (sys.path as -m sets it)."""
    import runpy

    sys.path[0] = os.getcwd()  # -m puts the working directory first: pickled providers import from it
    sys.argv = ["pulumi.dynamic", *args]
    runpy.run_module("providers.host", run_name="__main__", alter_sys=True)  # pulumi.dynamic, our errors untraced


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in ("exec", "dynamic") or (argv[1] == "exec" and len(argv) < 3):
        sys.stderr.write(__doc__)
        sys.exit(2)
    engine_pid = int(argv[0])
    die_with_parent(engine_pid)
    if argv[1] == "exec":
        binary = argv[2]
        os.environ["TMPDIR"] = private_tmp(engine_pid)
        os.execv(binary, [binary, *argv[3:]])
    watch_parent(engine_pid)
    run_dynamic(argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
