"""The embedded lab from the command line:

    python -m lab up [--nodes N] [--ttl SECONDS]   start it detached (or report the running one)
                     [--acme-address A]
    python -m lab status                           what runs
    python -m lab down                             stop everything it started, and verify

`up` starts one supervisor process (lab/supervisor.py) with a bounded lifetime; it runs the hub
(127.0.0.2), N emulated Talos nodes (127.0.10.11, .12, ...), a real control plane for every
cluster bootstrapped on them, and the stand-ins. State, logs and the hub kubeconfig live under
.state/lab/ (the kubeconfig stays after `down`, so `pulumi preview` of the lab stack still works).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import string
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from lab import supervisor as sup
from lab.process import pid_alive as _pid_exists

ROOT = sup.ROOT
UP_TIMEOUT = 300.0  # seconds for the hub and every node to listen
DOWN_TIMEOUT = 120.0  # seconds for the supervisor to stop its children
LEFTOVER_GRACE = 15.0  # seconds for children to follow a supervisor that was killed


def pid_alive(pid: int) -> bool:
    """Running, not a zombie: a detached supervisor is reaped by whoever adopted it, maybe never."""
    if not _pid_exists(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return True


# -- state files --------------------------------------------------------------------------------


def _read_pid(state: Path) -> int | None:
    try:
        return int((state / sup.PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def _read_status(state: Path) -> dict:
    try:
        return json.loads((state / sup.STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_supervisor(pid: int | None, state: Path) -> bool:
    if not pid or not pid_alive(pid):
        return False
    argv = _cmdline(pid)
    return "lab.supervisor" in argv and str(state.resolve()) in argv


def _is_tool(pid: int, name: str) -> bool:
    """The process is still the tool the status recorded (not a recycled pid)."""
    argv = _cmdline(pid)
    return bool(argv) and Path(argv[0]).name == name.rsplit("/", 1)[-1]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@contextmanager
def _locked(state: Path):
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _rel(path: str | Path) -> str:
    p = Path(path)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def _tools_env() -> dict[str, str]:
    env = dict(os.environ)
    try:
        bin_dir = subprocess.run([str(ROOT / "tools" / "install.sh"), "--print-bin"], capture_output=True, text=True,
                                 check=True, timeout=30).stdout.strip()
        env["PATH"] = os.pathsep.join([bin_dir, str(Path(sys.executable).parent), env.get("PATH", "")])
    except (OSError, subprocess.SubprocessError):
        pass
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


# -- output -------------------------------------------------------------------------------------


def describe(status: dict, state: Path) -> str:
    lines = []
    hub = status.get("hub")
    if hub:
        lines.append(f"  hub         {hub.get('server') or 'https://' + hub['address'] + ':6443'}   kubeconfig {_rel(hub['kubeconfig'])}")
    for n in status.get("nodes", []):
        cluster = f", cluster {n['cluster']}" if n.get("cluster") else ""
        lines.append(f"  Talos node  {n['address']}:{n['port']} ({n['mode']}{cluster})   control {n['control']}")
    for c in status.get("clusters", []):
        lines.append(f"  cluster     {c['name']}: {c['state']}, apiserver {c['apiserver']}, nodes {', '.join(c['nodes']) or '-'}")
    pids = status.get("pids", {})
    if pids:
        lines.append(f"  processes   supervisor {status.get('pid')} + {len(pids)}: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(pids.items())))
    acme = status.get("acme")
    if acme:
        lines.append(f"  ACME        {acme['directory']} (Pebble; CA {_rel(acme['caBundle'])}), DNS {acme['nameserver']}")
    lines.append(f"  logs        {_rel(state / 'logs')}")
    return "\n".join(lines)


def stack_config(status: dict) -> str:
    lines = ["lab stack config (stacks/Pulumi.lab.yaml):"]
    hub = status.get("hub")
    if hub:
        lines.append(f"  kontinuum:hubKubeconfigFile: {_rel(hub['kubeconfig'])}")
    lines.append("  kontinuum:zones:")
    for i, n in enumerate(status.get("nodes", [])):
        zone = string.ascii_lowercase[i] if i < 26 else f"z{i}"
        lines += [f"    - zone: {zone}", f"      talosAddresses: [{n['address']}]"]
    return "\n".join(lines)


# -- commands -----------------------------------------------------------------------------------


def cmd_up(args) -> int:
    state: Path = args.state_dir
    with _locked(state):
        pid = _read_pid(state)
        if _is_supervisor(pid, state):
            status = _wait_ready(state, pid, args.timeout)
            if status is None:
                return 1
            print(f"lab already running (supervisor pid {pid}, stops by itself at {status.get('ttl_deadline')})")
            print(describe(status, state))
            print(stack_config(status))
            return 0
        for stale in (sup.PID_FILE, sup.STATUS_FILE):
            (state / stale).unlink(missing_ok=True)
        logs = state / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "lab.supervisor", "--state-dir", str(state.resolve()),
                "--nodes", str(args.nodes), "--first-address", args.first_address,
                "--hub-address", args.hub_address, "--acme-address", args.acme_address, "--ttl", str(args.ttl)]
        t0 = time.monotonic()
        with open(logs / "supervisor.log", "ab") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=_tools_env(), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        status = _wait_ready(state, proc.pid, args.timeout, proc)
        if status is None:
            return 1
        print(f"lab up in {time.monotonic() - t0:.1f} s (supervisor pid {proc.pid}, stops by itself at "
              f"{status.get('ttl_deadline')}; `python -m lab down` stops it now)")
        print(describe(status, state))
        print(stack_config(status))
        return 0


def _wait_ready(state: Path, pid: int, timeout: float, proc: subprocess.Popen | None = None) -> dict | None:
    deadline = time.monotonic() + timeout
    while True:
        status = _read_status(state)
        if status.get("pid") == pid and status.get("phase") == "ready":
            return status
        exited = proc.poll() is not None if proc is not None else not pid_alive(pid)
        if exited or status.get("phase") == "failed":
            tail = "\n".join((state / "logs" / "supervisor.log").read_text(errors="replace").splitlines()[-25:])
            print(f"lab failed to start: {status.get('error') or 'the supervisor exited'}; last log lines:\n{tail}",
                  file=sys.stderr)
            if not exited:
                _stop_supervisor(pid, DOWN_TIMEOUT)
            return None
        if time.monotonic() > deadline:
            print(f"lab did not come up within {timeout:.0f} s (phase {status.get('phase')!r}); stopping it",
                  file=sys.stderr)
            _stop_supervisor(pid, DOWN_TIMEOUT)
            return None
        time.sleep(0.25)


def _stop_supervisor(pid: int, timeout: float) -> bool:
    """SIGTERM, wait, then SIGKILL (its children follow through PDEATHSIG). True if it stopped
    by itself."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.1)
    if not pid_alive(pid):
        return True
    os.kill(pid, signal.SIGKILL)
    while pid_alive(pid):
        _reap(pid)
        time.sleep(0.1)
    return False


def _reap(pid: int) -> None:
    """Collect the supervisor's exit status if this process started it (`up` that timed out)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def cmd_down(args) -> int:
    state: Path = args.state_dir
    with _locked(state):
        pid = _read_pid(state)
        before = _read_status(state)
        children = dict(before.get("pids", {}))
        t0 = time.monotonic()
        if _is_supervisor(pid, state):
            assert pid is not None
            clean = _stop_supervisor(pid, args.timeout)
            if not clean:
                print(f"the supervisor (pid {pid}) did not stop within {args.timeout:.0f} s; killed it", file=sys.stderr)
            children.update(_read_status(state).get("pids", {}))
            stopped = f"lab down in {time.monotonic() - t0:.1f} s (supervisor pid {pid}"
        else:
            stopped = "lab is not running (nothing to stop"
        left = _leftovers(children)
        if left:
            print("killing leftovers: " + ", ".join(f"{n} {p}" for n, p in left.items()), file=sys.stderr)
            for p in left.values():
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
            left = _leftovers(left, grace=0)
        (state / sup.PID_FILE).unlink(missing_ok=True)
        print(f"{stopped}; {len(children)} child processes checked, {len(left)} left running)")
        if before.get("hub"):
            print(f"hub kubeconfig kept at {_rel(before['hub']['kubeconfig'])}")
        return 1 if left else 0


def _leftovers(children: dict[str, int], grace: float = LEFTOVER_GRACE) -> dict[str, int]:
    """Recorded children that are still the same program and still running after `grace` s."""
    deadline = time.monotonic() + grace
    while True:
        left = {n: p for n, p in children.items() if pid_alive(p) and _is_tool(p, n)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def cmd_status(args) -> int:
    state: Path = args.state_dir
    pid = _read_pid(state)
    status = _read_status(state)
    if not _is_supervisor(pid, state):
        print("lab is not running")
        left = {n: p for n, p in status.get("pids", {}).items() if pid_alive(p) and _is_tool(p, n)}
        if left:
            print("but these processes it recorded still run: " + ", ".join(f"{n} {p}" for n, p in left.items()))
            return 1
        return 3
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    assert pid is not None
    rss = rss_kib(pid) + sum(rss_kib(p) for p in status.get("pids", {}).values())
    print(f"lab {status.get('phase')} (supervisor pid {pid}, since {status.get('started')}, "
          f"stops by itself at {status.get('ttl_deadline')}; RSS {rss / 1024:.0f} MiB)")
    print(describe(status, state))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=sup.DEFAULT_STATE, help="default: .state/lab")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the lab (detached) or report the running one")
    up.add_argument("--nodes", type=int, default=sup.DEFAULT_NODES, help="emulated Talos nodes (default 2)")
    up.add_argument("--first-address", default=sup.DEFAULT_FIRST_ADDRESS)
    up.add_argument("--hub-address", default=sup.DEFAULT_HUB_ADDRESS, help="'' runs no hub")
    up.add_argument("--acme-address", default=sup.DEFAULT_ACME_ADDRESS,
                    help="Pebble (ACME) address, its DNS server on the next one; '' runs none and the "
                         "certificate issuer stand-in replaces cert-manager (default 127.0.10.2)")
    up.add_argument("--ttl", type=float, default=sup.DEFAULT_TTL, help="seconds until the lab stops by itself (4 h)")
    up.add_argument("--timeout", type=float, default=UP_TIMEOUT, help="seconds to wait for it to come up")
    down = sub.add_parser("down", help="stop everything the lab started")
    down.add_argument("--timeout", type=float, default=DOWN_TIMEOUT)
    status = sub.add_parser("status", help="what runs")
    status.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.state_dir = args.state_dir.resolve()
    if args.command == "up":
        try:
            sup.node_addresses(args.first_address, args.nodes)
        except ValueError as e:
            parser.error(str(e))
        return cmd_up(args)
    if args.command == "down":
        return cmd_down(args)
    return cmd_status(args)


if __name__ == "__main__":
    sys.exit(main())
