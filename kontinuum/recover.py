"""Recovery after a killed `pulumi up` or `pulumi destroy`: what a CI runner that died mid-run
leaves behind is resolved here, without a person, before the next run.

A SIGKILLed engine leaves (1) its stack lock, and (2) pending operations in the state. The engine
drops pending updates and deletes by itself on the next run (the resource is still in the state
and the step runs again), but it carries pending *creates* forever and never retries them cleanly:
it asks for an interactive `pulumi refresh`. Per resource type, ours are safe to settle:

- dynamic resources (pulumi-python:dynamic): every create is idempotent (DESIGN §3), so the
  pending create is dropped and the next run creates again, finding what the killed one made;
- Kubernetes objects: the pinned provider creates with server-side apply, which adopts an
  object the killed create made; the pending create is dropped;
- Helm releases: the release records the killed install left (pending-install, or deployed
  when only the engine's bookkeeping was lost) are deleted, never the release's objects; Helm
  adopts those on the next install. An upgrade killed midway leaves a pending-upgrade record
  that blocks every later upgrade: it is deleted too (kontinuum.kube.helm_records);
- provider resources of the engine itself, and components (no provider ever called for
  them): dropped, registered again by the next run.

A lock is cleared only when it is provably stale: written on this host by a pid that no longer
runs the engine. Anything else stops recovery with what to do.

The state is edited with the engine's own `stack export` / `stack import` (no provider is
called, nothing else in the state changes); secrets are read only to reach a Helm release's
cluster and are never printed or written. With a file backend, whether anything needs doing is
read from the stack's lock directory and checkpoint file (kontinuum.file_backend): the engine is
started only when something does, not before every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kontinuum import file_backend
from kontinuum.errors import KontinuumError

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = ROOT / "tools" / "pulumi"
ENGINE_TIMEOUT = 300.0  # seconds for one engine command (export/import/cancel)
EMPTY_LOCK_AGE = 10.0  # seconds after which an unreadable lock file counts as a killed run's
CLUSTER_TIMEOUT = 10.0  # seconds per Kubernetes call when clearing Helm records
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
OURS = ("pulumi-python:dynamic", "kubernetes:", "pulumi:providers:")  # custom types whose creates are ours to redo


class RecoverError(KontinuumError):
    """Recovery cannot go on by itself; the message says what blocks it and what to do."""


@dataclass
class Plan:
    drop: list[dict] = field(default_factory=list)  # pending creates to drop from the state
    helm: list[dict] = field(default_factory=list)  # pending ops on Helm releases (records to clear first)
    unknown: list[dict] = field(default_factory=list)  # pending creates of types we cannot vouch for


def resource_type(urn: str) -> str:
    return urn.split("::")[2].rsplit("$", 1)[-1]


def plan(deployment: dict) -> Plan:
    """What to do about each pending operation of an exported deployment (pure)."""
    out = Plan()
    for op in deployment.get("pending_operations") or []:
        res, kind = op.get("resource") or {}, op.get("type")
        rtype = res.get("type") or resource_type(res.get("urn", "::::"))
        if rtype == HELM_RELEASE and kind in ("creating", "updating"):
            out.helm.append(op)
        if kind != "creating":
            continue  # the engine drops it on the next run and runs the step again
        if not res.get("custom") or rtype == HELM_RELEASE or rtype.startswith(OURS):
            out.drop.append(op)
        else:
            out.unknown.append(op)
    return out


def pending(p: Plan) -> bool:
    return bool(p.drop or p.helm or p.unknown)


def without(deployment: dict, ops: list[dict]) -> dict:
    """The deployment with the given pending operations removed (by URN and operation type)."""
    gone = {(o["resource"]["urn"], o["type"]) for o in ops}
    kept = [o for o in deployment.get("pending_operations") or [] if (o["resource"]["urn"], o["type"]) not in gone]
    return {**deployment, "pending_operations": kept}


# -- the engine ---------------------------------------------------------------------------------


def engine(*args: str, cwd: Path, input_file: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "KONTINUUM_RECOVER": "0"}
    try:
        return subprocess.run([str(WRAPPER), "--non-interactive", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=ENGINE_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RecoverError(f"`pulumi {args[0]} {args[1] if len(args) > 1 else ''}` did not finish within "
                           f"{ENGINE_TIMEOUT:g} s") from None


def stack_args(stack: str | None) -> list[str]:
    return ["--stack", stack] if stack else []


def export(stack: str | None, cwd: Path, *, show_secrets: bool = False) -> dict | None:
    """The stack's deployment, or None when the stack does not exist yet."""
    r = engine("stack", "export", *stack_args(stack), *(["--show-secrets"] if show_secrets else []), cwd=cwd)
    if r.returncode != 0:
        if "no stack named" in r.stderr or "does not exist" in r.stderr:
            return None
        raise RecoverError(f"`pulumi stack export` failed: {r.stderr.strip()[-800:]}"
                           + ("; reading secrets needs the stack's passphrase (PULUMI_CONFIG_PASSPHRASE)"
                              if show_secrets and "passphrase" in r.stderr.lower() else ""))
    return json.loads(r.stdout)


def project_name(cwd: Path) -> str | None:
    try:
        name = yaml.safe_load((cwd / "Pulumi.yaml").read_text())["name"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None  # not a project folder: the engine will say so
    return name if isinstance(name, str) else None


def selected_stack(cwd: Path) -> str | None:
    """The stack the engine would pick: PULUMI_STACK, else the workspace's selection for this
    backend (PULUMI_HOME/workspaces/<project>-<sha1 of Pulumi.yaml's path>-workspace.json, as
    pulumi v3.274.1 writes it), else (no such entry) the engine's own answer."""
    if "PULUMI_STACK" in os.environ:
        return os.environ["PULUMI_STACK"] or None
    name, backend = project_name(cwd), os.environ.get("PULUMI_BACKEND_URL", "")
    if name and backend:
        digest = hashlib.sha1(str((cwd / "Pulumi.yaml").resolve()).encode()).hexdigest()  # noqa: S324 - the engine's key
        home = Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi")
        try:
            chosen = json.loads((home / "workspaces" / f"{name}-{digest}-workspace.json").read_text())["stacks"][backend]
        except (OSError, ValueError, KeyError, TypeError):
            chosen = None
        if isinstance(chosen, str) and chosen:
            return chosen
    r = engine("stack", "--show-name", cwd=cwd)
    return r.stdout.strip() or None if r.returncode == 0 else None


def seen_export(stack: str, cwd: Path) -> dict | None:
    """The stack's export read from a file backend without the engine (None: no such stack);
    file_backend.NotReadable where only the engine can tell."""
    project = project_name(cwd)
    parts = stack.split("/")
    if project is None or len(parts) not in (1, 3) or (len(parts) == 3 and parts[1] != project):
        raise file_backend.NotReadable(stack)
    return file_backend.checkpoint(os.environ.get("PULUMI_BACKEND_URL", ""), project, parts[-1])


def current_export(stack: str, cwd: Path) -> dict | None:
    """The stack's export: read from its checkpoint file where the backend allows, else the engine's."""
    try:
        return seen_export(stack, cwd)
    except file_backend.NotReadable:
        return export(stack, cwd)


def clear_stale_locks(stack: str, cwd: Path, log) -> None:
    project = project_name(cwd)
    if project is None:
        return
    backend = os.environ.get("PULUMI_BACKEND_URL", "")
    locks = file_backend.lock_files(backend, project, stack.rsplit("/", 1)[-1])
    if not locks:
        repair(backend, project, stack, log)
        return
    host = socket.gethostname()
    contents = []
    for f in locks:
        try:
            contents.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            # an engine writes its lock at once: one left unreadable for a while was killed writing it
            old = time.time() - f.stat().st_mtime > EMPTY_LOCK_AGE if f.exists() else True
            contents.append({"hostname": host, "pid": 0} if old else {})
    live = [c for c in contents if not file_backend.stale(c, host)]
    if live:
        who = ", ".join(f"pid {c.get('pid')} on {c.get('hostname')} since {c.get('timestamp')}" for c in live)
        raise RecoverError(f"stack {stack} is locked by a run that may still be going ({who}); wait for it, or, "
                           f"once you know it is dead, run `tools/pulumi cancel --stack {stack} --yes` and re-run")
    repair(backend, project, stack, log)  # `cancel` loads the checkpoint: it must be readable
    r = engine("cancel", "--yes", "--stack", stack, cwd=cwd)
    if r.returncode != 0:
        raise RecoverError(f"`pulumi cancel` of the stale lock failed: {r.stderr.strip()[-800:]}")
    log(f"recover: cleared {len(locks)} stale lock(s) of stack {stack} (engine pid "
        f"{', '.join(str(c.get('pid')) for c in contents)} on this host is gone)")


def repair(backend: str, project: str, stack: str, log) -> None:
    for path in file_backend.repair_attributes(backend, project, stack.rsplit("/", 1)[-1]):
        log(f"recover: rewrote {path.name}, which the killed run left half-written")


def secret_value(v):
    """A value from `stack export --show-secrets`: secrets come as {<sig>, plaintext: <json>}."""
    if isinstance(v, dict) and "plaintext" in v:
        try:
            return json.loads(v["plaintext"])
        except (TypeError, ValueError):
            return v["plaintext"]
    return v


def release_target(op: dict, deployment: dict) -> tuple[str, str, str | None]:
    """(namespace, release name, kubeconfig of its provider or None) of a pending Helm op."""
    res = op["resource"]
    props = {**(res.get("inputs") or {}), **(res.get("outputs") or {})}
    name, namespace = secret_value(props.get("name")), secret_value(props.get("namespace")) or "default"
    provider_urn = (res.get("provider") or "").rsplit("::", 1)[0]
    kubeconfig = None
    for r in deployment.get("resources") or []:
        if r["urn"] == provider_urn:
            kubeconfig = secret_value((r.get("inputs") or {}).get("kubeconfig"))
    return namespace, name, kubeconfig if isinstance(kubeconfig, str) else None


def settle_helm(ops: list[dict], stack: str | None, cwd: Path, log) -> list[dict]:
    """Clear each pending Helm op's stale records; returns the ops whose cluster did not answer
    (their pending create stays in the state, and the next recovery tries again)."""
    from kontinuum.kube import helm_records

    revealed = export(stack, cwd, show_secrets=True) or {}
    deployment = revealed.get("deployment") or {}
    by_urn = {(o["resource"]["urn"], o["type"]): o for o in deployment.get("pending_operations") or []}
    unreachable = []
    for op in ops:
        full = by_urn.get((op["resource"]["urn"], op["type"]), op)
        namespace, name, kubeconfig = release_target(full, deployment)
        if not name or not kubeconfig:
            continue  # the release never had a provider: nothing reached a cluster
        try:
            cleared = helm_records.clear(kubeconfig, namespace, name, op["type"], timeout=CLUSTER_TIMEOUT)
        except helm_records.HelmRecordError as e:
            if "did not answer" not in str(e):
                raise RecoverError(str(e)) from None
            log(f"recover: warning: {e}; its pending operation stays for the next run")
            unreachable.append(op)
            continue
        for rec in cleared:
            log(f"recover: Helm release {namespace}/{name}: deleted record v{rec.revision} ({rec.status}) "
                "left by the killed run; its objects stay and the next run adopts them")
    return unreachable


def import_deployment(stack: str | None, cwd: Path, exported: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="kontinuum-recover-") as tmp:
        path = Path(tmp) / "state.json"
        path.write_text(json.dumps(exported))
        r = engine("stack", "import", *stack_args(stack), "--file", str(path), cwd=cwd)
    if r.returncode != 0:
        raise RecoverError(f"`pulumi stack import` failed: {r.stderr.strip()[-800:]}")


def recover(stack: str | None, cwd: Path, log=lambda m: print(m, file=sys.stderr)) -> dict | None:
    """Settle what a killed run left in `stack`; returns the stack's export as it now stands
    (None: no stack), so that the state migrations need not export it again."""
    stack = stack or selected_stack(cwd)
    if not stack:
        return None  # no stack selected: the engine says so itself
    clear_stale_locks(stack, cwd, log)
    exported = current_export(stack, cwd)
    if exported is None or not pending(plan(exported.get("deployment") or {})):
        return exported  # the common case: nothing to settle, and (file backend) no engine started
    exported = export(stack, cwd)  # the engine's own export: what is settled below is imported back
    if exported is None:
        return None
    todo = plan(exported.get("deployment") or {})
    if todo.unknown:
        urns = "\n  ".join(o["resource"]["urn"] for o in todo.unknown)
        raise RecoverError(f"pending creates of types recovery does not know:\n  {urns}\ncheck each in its "
                           f"provider, then run `tools/pulumi refresh --stack {stack}` interactively")
    if not todo.drop and not todo.helm:
        return exported  # the state changed since it was read: nothing left to do
    keep = settle_helm(todo.helm, stack, cwd, log) if todo.helm else []
    kept = {(o["resource"]["urn"], o["type"]) for o in keep}
    drop = [o for o in todo.drop if (o["resource"]["urn"], o["type"]) not in kept]
    if drop:
        exported["deployment"] = without(exported["deployment"], drop)
        import_deployment(stack, cwd, exported)
        for o in drop:
            log(f"recover: dropped the pending create of {o['resource']['urn']} (the next run creates it again)")
    return exported
