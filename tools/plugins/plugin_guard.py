"""The dynamic-provider host dies with the engine that started it.

The engine starts each plugin in a process group of its own, so a CI runner that SIGKILLs
`pulumi up` (its whole process group) leaves the plugins running, each holding its memory
for as long as it likes. This guard runs in the host's own interpreter, before the host:

- it asks the kernel for SIGKILL when the parent (the engine) dies (PR_SET_PDEATHSIG);
- it refuses to start when the engine is already gone (the signal would never come);
- a thread also watches the parent pid and exits when it changes (a second way, in case the
  first one fails).

The Go plugins (the kubernetes provider, the language host) get the same from the compiled
kontinuum-plugin-guard (tools/plugin-guard), which costs no interpreter start; our program
executor (pulumi-language-python-exec) uses die_with_parent from here.

Usage (from the launcher beside this file, with the engine's pid as the first argument):
  plugin_guard.py <engine-pid> dynamic [args...]         run `python -m pulumi.dynamic`
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL = 1.0  # seconds between parent checks in the dynamic host


def die_with_parent(engine_pid: int) -> None:
    """Arm PR_SET_PDEATHSIG, then make sure the engine did not die before it was armed."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        sys.stderr.write(f"plugin_guard: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}\n")
    if os.getppid() != engine_pid:
        sys.stderr.write(f"plugin_guard: the engine (pid {engine_pid}) is gone; not starting\n")
        os._exit(1)


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
    if len(argv) < 2 or argv[1] != "dynamic":
        sys.stderr.write(__doc__)
        sys.exit(2)
    engine_pid = int(argv[0])
    die_with_parent(engine_pid)
    watch_parent(engine_pid)
    run_dynamic(argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
