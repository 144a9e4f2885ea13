"""One region's preview through the engine, bounded, for `python -m kontinuum preview`.

The engine runs as `tools/pulumi preview --json` on the stack's own config file. A preview
contacts no Talos machine (every dynamic provider's check/diff is pure); the Kubernetes
provider would dial each zone's API server and the hub, so its client timeout is bounded
(PULUMI_K8S_CLIENT_TIMEOUT, seconds per request): a cluster that does not answer in time is
treated by the provider as unreachable and its objects are diffed against the recorded state.
The whole engine run is bounded too, and killed with its plugins (a process group) when over.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = ROOT / "tools" / "pulumi"


@dataclass
class EngineRun:
    returncode: int | None  # None: killed at the bound
    plan: dict | None
    errors: list[str]
    warnings: list[str]
    stderr: str


def _bounded(argv: list[str], env: dict, timeout: float, cwd: Path) -> tuple[int | None, str, str]:
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the engine and every plugin it started
        out, err = proc.communicate()
        return None, out, err


def engine_env(cluster_timeout: float) -> dict:
    env = dict(os.environ)
    env["PULUMI_K8S_CLIENT_TIMEOUT"] = str(max(1, int(cluster_timeout)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def list_stacks(*, timeout: float, cwd: Path = ROOT) -> tuple[set[str] | None, str]:
    """The stacks the backend holds for this project, or (None, why) when it does not answer."""
    code, out, err = _bounded([str(WRAPPER), "--non-interactive", "stack", "ls", "--json"], engine_env(5), timeout, cwd)
    backend = os.environ.get("PULUMI_BACKEND_URL") or "the default backend (.state/backend)"
    if code is None:
        return None, f"the state backend {backend} did not answer within {timeout:g} s"
    if code != 0:
        return None, f"the state backend {backend} failed: {err.strip()[-600:]}"
    try:
        return {s["name"].rsplit("/", 1)[-1] for s in json.loads(out or "[]")}, ""
    except (ValueError, KeyError, TypeError):
        return None, f"`pulumi stack ls` printed no stack list: {out.strip()[-300:]}"


def preview(stack: str, config_file: Path, *, refresh: bool, cluster_timeout: float, timeout: float,
            cwd: Path = ROOT) -> EngineRun:
    argv = [str(WRAPPER), "--non-interactive", "preview", "--stack", stack, f"--config-file={config_file}", "--json"]
    if refresh:
        argv.append("--refresh")
    code, out, err = _bounded(argv, engine_env(cluster_timeout), timeout, cwd)
    plan, errors, warnings = None, [], []
    try:
        doc = json.loads(out) if out.strip() else {}
    except ValueError:
        doc = {}
    for d in doc.get("diagnostics") or []:
        text = (d.get("message") or "").strip()
        (errors if d.get("severity") == "error" else warnings).append(text)
    if code == 0 and "steps" in doc:
        plan = doc
    if code is None:
        errors.append(f"the preview did not finish within {timeout:g} s (killed); raise --timeout or look for a "
                      "hung backend or provider")
    elif code != 0 and not errors:
        errors.append(err.strip()[-1500:] or out.strip()[-1500:] or f"the engine exited {code}")
    return EngineRun(code, plan, errors, warnings, err)


def answers(url: str, timeout: float) -> bool:
    """Whether an API server completes a TLS handshake within `timeout` (no request is sent).
    The Kubernetes provider gives up on a cluster silently; this is how the summary can say
    which clusters' live objects were not compared."""
    parsed = urlparse(url)
    host, port = parsed.hostname, parsed.port or 443
    if not host:
        return False
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # reachability only, nothing is trusted
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            raw.settimeout(timeout)
            with ctx.wrap_socket(raw, server_hostname=host):
                return True
    except (OSError, ssl.SSLError):
        return False


def unanswered(endpoints: dict[str, str], timeout: float) -> list[str]:
    """Labels of the endpoints that do not answer, probed in parallel."""
    if not endpoints:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(endpoints))) as pool:
        ok = dict(zip(endpoints, pool.map(lambda u: answers(u, timeout), endpoints.values())))
    return sorted(label for label, good in ok.items() if not good)
