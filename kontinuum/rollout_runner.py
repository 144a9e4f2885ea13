"""What `python -m kontinuum rollout` does to a region and to a wave, each bounded: one region's
`pulumi up` through tools/pulumi (which settles what a killed earlier run left first), and the
gate between waves, which reads every zone of the wave with the read-only probe of `status`
until all are ready, then keeps reading them for the soak.

A region's up that outlives its bound is interrupted as Ctrl-C would (the engine stops starting
steps and waits for the running ones), then killed with its plugins after a grace period; the
next run's tools/pulumi recovers what that left.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kontinuum.preview_runner import ROOT, WRAPPER, engine_env

GRACE = 60.0  # seconds an interrupted up has to stop before it is killed
NOISE = ("Resource monitor has terminated", "preview failed", "update failed")  # follow-ups of the real error
HEALTHY_ENOUGH = 1  # fleet_status levels: fine and warning (an old backup, a credential to renew) pass the gate,
# except a version other than configured


@dataclass
class UpResult:
    stack: str
    ok: bool
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def json_documents(text: str) -> list[dict]:
    """`pulumi up --yes --json` prints the preview's document, then the update's engine events
    (one JSON object each)."""
    docs, decoder, i = [], json.JSONDecoder(), 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        try:
            doc, i = decoder.raw_decode(text, i)
        except ValueError:
            return docs
        if isinstance(doc, dict):
            docs.append(doc)


def diagnostics(docs: list[dict]) -> list[dict]:
    """The preview document's diagnostics and the update's diagnostic events, in order."""
    out = []
    for doc in docs:
        out += doc.get("diagnostics") or []
        if "diagnosticEvent" in doc:
            d = doc["diagnosticEvent"]
            out.append({"severity": d.get("severity"), "message": (d.get("prefix") or "") + (d.get("message") or "")})
    return out


def changes(docs: list[dict]) -> dict[str, int]:
    """What the update did (its summary event), else what its preview planned."""
    for doc in reversed(docs):
        found = (doc.get("summaryEvent") or {}).get("resourceChanges") or doc.get("changeSummary")
        if found is not None:
            return {k: v for k, v in found.items() if v}
    return {}


def error_lines(out: str, err: str, code: int | None) -> list[str]:
    """The engine's own error diagnostics (each once, in order); otherwise its stderr's errors."""
    lines: list[str] = []
    for d in diagnostics(json_documents(out)):
        text = (d.get("message") or "").strip()
        if d.get("severity") == "error" and text and not any(n in text for n in NOISE) and text not in lines:
            lines.append(text)
    if not lines:
        lines = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("error:")]
    if not lines and code != 0:
        lines = [err.strip()[-1500:] or f"the engine exited {code}"]
    return lines


def _run(argv: list[str], env: dict, timeout: float, cwd: Path, grace: float) -> tuple[int | None, str, str]:
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: no new steps, running ones finish
        try:
            out, err = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the engine; its plugins' launchers end with it
            try:
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # a straggler holds the pipes: give up on its output
                out, err = "", f"the engine was killed after {timeout + grace:g} s; its output was not readable"
        return None, out, err


def keep_log(log_dir: Path, stack: str, out: str, err: str) -> Path:
    """The region's whole up output, for the operator reading a failure beyond its first lines:
    owner-only (the engine masks secrets, but the output names every resource of the region)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{stack}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file kept from an earlier run may have had other modes: before any byte
    with os.fdopen(fd, "w") as f:
        f.write(f"# pulumi up --stack {stack}: standard output (JSON events)\n{out}")
        f.write(f"\n# standard error\n{err}")
    return path


def up(stack: str, config_file: Path, *, timeout: float, grace: float = GRACE, cwd: Path = ROOT,
       log_dir: Path | None = None) -> UpResult:
    """One region's `pulumi up`, bounded by `timeout` seconds; its output kept in `log_dir`."""
    argv = [str(WRAPPER), "--non-interactive", "up", "--yes", "--stack", stack, f"--config-file={config_file}",
            "--json"]
    t0 = time.monotonic()
    code, out, err = _run(argv, engine_env(30), timeout, cwd, grace)
    took = time.monotonic() - t0
    counts = changes(json_documents(out))
    errors = error_lines(out, err, code)
    if log_dir is not None:
        kept = keep_log(log_dir, stack, out, err)
        if code != 0:
            errors.append(f"the whole output: {kept}")
    if code is None:
        errors.insert(0, f"`pulumi up` did not finish within {timeout:g} s and was interrupted (raise --timeout, "
                         "or look at the zone); the next run settles what it left")
    return UpResult(stack, code == 0, took, counts, errors if code != 0 else [])


# --- the gate ----------------------------------------------------------------------------------


def probe(deployments: dict[str, dict], *, timeout: float) -> dict[str, tuple[int, list[str]]]:
    """`stack/cluster` → (level, findings) for every zone of the given stacks' states."""
    from kontinuum import fleet_status as fs
    from kontinuum.status_probe import observe_stack

    now = dt.datetime.now(dt.timezone.utc)
    out = {}
    for stack, deployment in deployments.items():
        try:
            _, seen = observe_stack(deployment, stack, timeout=timeout, now=now)
        except Exception as e:  # noqa: BLE001 - a zone that cannot be read is not ready; the gate says why
            out[stack] = (fs.UNREACHABLE, [f"{type(e).__name__}: {e}"])
            continue
        for item in seen:
            if isinstance(item, tuple):
                out[f"{stack}/{item[0]}"] = (fs.UNREACHABLE, [item[1]])
                continue
            z = fs.judge(item, now=now, renew_before=dt.timedelta(days=item.renew_before_days or 30),
                         backup_max_age=dt.timedelta(hours=26))
            # Running what the config says is part of ready: an up that upgraded must have reached every node.
            held = [f.text for f in z.findings if f.level > HEALTHY_ENOUGH] + [f.text for f in fs.other_versions(item)]
            out[f"{stack}/{z.cluster}"] = (fs.UNHEALTHY if held and z.level <= HEALTHY_ENOUGH else z.level, held)
    return out


def _bad(seen: dict[str, tuple[int, list[str]]]) -> list[str]:
    return [f"{zone}: {'; '.join(texts)}" for zone, (level, texts) in sorted(seen.items()) if level > HEALTHY_ENOUGH]


def gate(stacks: list[str], *, ready_timeout: float, soak: float, interval: float, probe_timeout: float,
         log, cwd: Path = ROOT) -> str | None:
    """None once every zone of `stacks` is ready and stayed so for `soak` seconds; else what
    failed, naming the zone and what the probe found."""
    from kontinuum.recover import RecoverError, export

    deployments = {}
    for stack in stacks:
        try:
            exported = export(stack, cwd, show_secrets=True)
        except RecoverError as e:
            return f"stack {stack}: its state cannot be read for the health check: {e}"
        deployments[stack] = (exported or {}).get("deployment") or {}
    start = time.monotonic()
    while True:
        bad = _bad(probe(deployments, timeout=probe_timeout))
        if not bad:
            break
        if time.monotonic() - start + interval > ready_timeout:
            return f"zones not ready within {ready_timeout:g} s (--ready-timeout):\n" + "\n".join(bad)
        time.sleep(interval)
    log(f"every zone of {', '.join(stacks)} is ready after {time.monotonic() - start:.0f} s; soaking {soak:g} s")
    soak_start = time.monotonic()
    while (left := soak - (time.monotonic() - soak_start)) > 0:
        time.sleep(min(interval, left))
        bad = _bad(probe(deployments, timeout=probe_timeout))
        if bad:
            return (f"a zone became unhealthy {time.monotonic() - soak_start:.0f} s into the {soak:g} s soak:\n"
                    + "\n".join(bad))
    return None
