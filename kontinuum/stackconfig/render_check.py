"""Render every pool's machine config with all its patches and judge it before anything is
registered: our own checks on the patched result, then Talos's own validator (the pinned
kontinuum-talos-validate helper, one process for the whole stack).

So a patch that cannot apply, or one that leaves an invalid config, fails `pulumi preview`
(and `python -m kontinuum check`) naming the zone, pool, nodes and patch index, instead of a
node rejecting it halfway through `pulumi up`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from kontinuum.errors import ConfigError, KontinuumError
from kontinuum.talos import configpatch, machineconfig, pki, secrets
from kontinuum.talos.clusterspec import CONTROLPLANE, ClusterSpec, spec_problems
from kontinuum.talos.precheck import precheck_doc
from kontinuum.stackconfig.model import StackConfig, Zone
from kontinuum.stackconfig.specs import cluster_spec

VALIDATOR = "kontinuum-talos-validate"
VALIDATOR_TIMEOUT = 60.0  # seconds for the whole stack; measured ~2 ms per config


@dataclass
class Report:
    errors: list[ConfigError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. the helper is not built yet
    configs: int = 0
    validator_seconds: float = 0.0


def _bundle() -> secrets.SecretsBundle:
    """A throwaway bundle: real key types where the config reads them, but an EC service-account
    key instead of RSA (1.2 s to generate), which no validator looks at. Never leaves this process."""
    ca = pki.new_ca(organizations=["kubernetes"], key_type="ecdsa", days=1)
    return secrets.SecretsBundle(
        cluster_id="dmFsaWRhdGlvbg==", cluster_secret="dmFsaWRhdGlvbg==", bootstrap_token="abcdef.0123456789abcdef",
        secretbox_secret="dmFsaWRhdGlvbg==", trustd_token="abcdef.0123456789abcdef",
        os=pki.new_ca(organizations=["talos"], key_type="ed25519", days=1), k8s=ca, k8s_aggregator=ca,
        k8s_serviceaccount_key=pki.talos_key_pem(pki.new_key("ecdsa")), etcd=ca)


def _where(path: str, zone_index: int, raw: dict) -> str:
    """`zones[i].x.y` → `defaults.x.y` when the zone took that setting from `defaults`."""
    prefix = f"zones[{zone_index}]."
    if not path.startswith(prefix):
        return path
    rest = path[len(prefix):]
    zones = raw.get("zones") or []
    zone = zones[zone_index] if zone_index < len(zones) and isinstance(zones[zone_index], dict) else {}
    top = re.split(r"[.\[]", rest, maxsplit=1)[0]
    node = zone
    for token in re.findall(r"[^.\[\]]+", rest):
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return path if top in zone else f"defaults.{rest}"
    return path


def _doc_problems(doc: dict) -> list[str]:
    """Our checks, on the patched result (a patch may change the subnets)."""
    net = (doc.get("cluster") or {}).get("network") or {}
    nets = {}
    for key in ("podSubnets", "serviceSubnets"):
        nets[key] = []
        for i, value in enumerate(net.get(key) or []):
            try:
                nets[key].append((i, ipaddress.ip_network(str(value), strict=True)))
            except ValueError:
                pass  # machinery names an invalid CIDR itself
    return [f"cluster.network.serviceSubnets[{j}] {svc} overlaps cluster.network.podSubnets[{i}] {pod}"
            for i, pod in nets["podSubnets"] for j, svc in nets["serviceSubnets"]
            if pod.version == svc.version and pod.overlaps(svc)]


def _render(spec: ClusterSpec, bundle: secrets.SecretsBundle, pool: str,
            pool_path: str) -> tuple[dict | None, list[ConfigError]]:
    """The pool's config with every patch applied that can apply, and an error for each one
    that cannot: each operation of a JSON patch is tried on its own, so all are reported."""
    bare = replace(spec, patches=(), control_plane=replace(spec.control_plane, patches=()),
                   workers=tuple(replace(w, patches=()) for w in spec.workers))
    try:
        doc = machineconfig.build(bare, bundle, pool=pool)
    except ConfigError as exc:
        return None, list(getattr(exc, "errors", [exc]))
    own = spec.control_plane if pool == CONTROLPLANE else next(w for w in spec.workers if w.name == pool)
    errors: list[ConfigError] = []
    for layer, patches in (("patches", spec.patches), (f"{pool_path}.patches", own.patches)):
        for i, patch in enumerate(patches):
            where = f"{layer}[{i}]"
            try:
                patch = configpatch.normalize(patch, where)
            except ConfigError as exc:
                errors.append(exc)
                continue
            steps = [(f"{where}[{j}]", [op]) for j, op in enumerate(patch)] if isinstance(patch, list) else [(where, patch)]
            for step_where, step in steps:
                try:
                    patched = configpatch.apply(doc, step, step_where)
                except ConfigError as exc:
                    errors.append(ConfigError(exc.path.replace(f"{step_where}[0]", step_where), exc.problem))
                    continue
                if not isinstance(patched, dict):
                    errors.append(ConfigError(step_where, "patch must leave a mapping at the document root"))
                    continue
                doc = patched
    return doc, errors


def _pools(zone: Zone):
    yield zone.control_plane, "controlPlane"
    for i, w in enumerate(zone.workers):
        if w.replicas > 0:
            yield w, f"workers[{i}]"


def find_validator() -> str | None:
    found = os.environ.get("KONTINUUM_TALOS_VALIDATE") or shutil.which(VALIDATOR)
    if found:
        return found
    try:
        bin_dir = subprocess.run([str(Path(__file__).parents[2] / "tools" / "install.sh"), "--print-bin"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    candidate = Path(bin_dir) / VALIDATOR
    return str(candidate) if bin_dir and os.access(candidate, os.X_OK) else None


def _key_paths(node, prefix: str = "") -> list[str]:
    if not isinstance(node, dict) or not node:
        return [prefix] if prefix else []
    return [p for k, v in node.items() for p in _key_paths(v, f"{prefix}.{k}" if prefix else str(k))]


def _machinery_text(error: str) -> str:
    """machinery's multierror layout (`1 error occurred:\\n\\t* …`) as one line. Unknown keys are
    named by their paths only: machinery quotes their values, which a patch may hold secrets in."""
    head, sep, tail = error.partition("unknown keys found during decoding:")
    if sep:
        try:
            keys = _key_paths(yaml.safe_load(tail))
        except yaml.YAMLError:
            keys = []
        return " ".join(head.split()) + f" unknown keys {', '.join(keys) or '(unreadable)'}"
    items = [line.strip()[2:] for line in error.splitlines() if line.strip().startswith("* ")]
    items = [i for i in items if not re.search(r"errors? occurred:$", i)]
    return " ".join(("; ".join(items) or error).split())


def validate(items: list[dict], validator: str) -> list[dict]:
    proc = subprocess.run([validator], input=json.dumps(items), capture_output=True, text=True,
                          timeout=VALIDATOR_TIMEOUT)
    if proc.returncode != 0:
        raise KontinuumError(f"{VALIDATOR} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def check(stack: StackConfig, raw: dict, *, validator: str | None = None, use_validator: bool = True,
          skip: set[int] = frozenset()) -> Report:
    """Render each pool of each zone and judge it; every problem of every zone at once."""
    report, bundle, items, owners = Report(), _bundle(), [], []
    seen: set[str] = set()

    def add(path: str, problem: str) -> None:
        text = f"{path}: {problem}"
        if text not in seen:  # a setting from `defaults` fails the same way in every zone: once
            seen.add(text)
            report.errors.append(ConfigError(path, problem))

    for n, zone in enumerate(stack.zones):
        zi = stack.zone_index[n] if stack.zone_index else n
        if zi in skip:
            continue
        name = f"{stack.region}-{zone.zone}"
        first = next((m.addresses[0] for m in zone.machines if m.pool == "controlplane"), "127.0.0.1")
        spec = cluster_spec(name, zone, zone.endpoint or f"https://{first}:6443")
        problems = spec_problems(spec, f"zones[{zi}].")
        for e in problems:
            add(_where(e.path, zi, raw), e.problem)
        if problems:
            continue
        for pool, pool_path in _pools(zone):
            nodes = [m.addresses[0] for m in zone.machines if m.pool == pool.name]
            where = f"(zone {zone.zone}, pool {pool.name}, node{'s' * (len(nodes) != 1)} {', '.join(nodes) or 'none'})"
            doc, failed = _render(spec, bundle, pool.name, pool_path)
            for e in failed:
                path = _where(f"zones[{zi}].{e.path}", zi, raw)
                add(path, e.problem if path.startswith("defaults.") else f"{e.problem} {where}")
            if doc is None:
                continue
            report.configs += 1
            ours = precheck_doc(doc) + _doc_problems(doc)  # precheck, minus YAML
            for problem in ours:
                add(f"zones[{zi}].{pool_path}", f"patched config is invalid: {problem} {where}")
            if failed or ours:
                continue  # Talos would only repeat what is already said
            # JSON is YAML to Talos's loader, and 20x cheaper to write than YAML here.
            items.append({"name": f"{zi}/{pool_path}", "config": json.dumps(doc)})
            owners.append((f"zones[{zi}].{pool_path}", where))
    if not use_validator or not items:
        return report
    validator = validator or find_validator()
    if validator is None:
        report.notes.append(f"Talos's own validator ({VALIDATOR}) is not built yet (`make tools`); the machine "
                            "configs were checked by Kontinuum's own checks only")
        return report
    started = time.monotonic()
    verdicts = validate(items, validator)
    report.validator_seconds = time.monotonic() - started
    for (path, where), verdict in zip(owners, verdicts):
        if not verdict.get("ok"):
            add(path, f"Talos rejects the patched machine config: {_machinery_text(verdict.get('error', ''))} {where}")
    return report
