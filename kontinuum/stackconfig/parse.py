"""From the `kontinuum:` values to the typed stack config (model.py), with path-precise errors.

Everything is checked before a single resource is registered, and every problem is reported
at once with its path (`zones[1].controlPlane.replicas: must be 1, 3 or 5, got 2`), so an
operator fixes the file in one round. Shapes, unknown keys and value formats come from the one
contract (contract.py); this module adds what needs several values at once (pools vs machines,
addresses used twice, version pairs) and builds the typed config. It reads plain data:
__main__ feeds it from the engine's config, `python -m kontinuum check` from the stack file.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from kontinuum.backup.files import DEFAULT_DIRECTORY as BACKUP_DIRECTORY
from kontinuum.backup.files import DEFAULT_KEEP as BACKUP_KEEP
from kontinuum.dns import tsig
from kontinuum.errors import ConfigError, ConfigErrors
from kontinuum.stackconfig import contract, exposure, flux, schema
from kontinuum.stackconfig.contract import (CONTROL_PLANE_POOL, DEFAULT_CHARTS, DEFAULT_GATEWAY_API,
                                            DEFAULT_KUBERNETES_VERSION, DEFAULT_SERVER_IMAGE, DEFAULT_TIMEOUTS,
                                            LETSENCRYPT)
from kontinuum.stackconfig.model import (Addon, Addons, Auth, Backup, ChartSource, Hub, Machine, Pool, StackConfig,
                                         Upgrade, Zone)
from kontinuum.talos import support
from kontinuum.talos.renewal import RENEW_BEFORE_DAYS


def _merge(base: Any, over: Any) -> Any:
    """Deep merge of mappings: zone settings win over `defaults`; lists are replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = copy.deepcopy(base)
        for k, v in over.items():
            out[k] = _merge(out.get(k), v) if k in out else copy.deepcopy(v)
        return out
    return copy.deepcopy(over)


class _Errors(list):
    def add(self, path: str, problem: str) -> None:
        self.append(ConfigError(path, problem))


def _machines(raw: list, path: str, pools: set[str], errs: _Errors) -> tuple[Machine, ...]:
    out = []
    for i, entry in enumerate(raw):
        p = f"{path}[{i}]"
        if isinstance(entry, str):
            entry = {"address": entry}
        if "address" in entry and "addresses" in entry:
            errs.add(p, "give `address` or `addresses`, not both")
            continue
        addrs = entry.get("addresses", [entry["address"]] if "address" in entry else [])
        if not addrs:
            errs.add(p, "needs `address` or a non-empty `addresses` list")
            continue
        pool = entry.get("pool", CONTROL_PLANE_POOL)
        if pool not in pools:
            errs.add(f"{p}.pool", f"unknown pool {pool!r}; known: {', '.join(sorted(pools))}")
        out.append(Machine(tuple(addrs), pool, bool(entry.get("lost", False))))
    return tuple(out)


def _check_lost(machines: tuple[Machine, ...], path: str, errs: _Errors) -> None:
    """Every control plane marked lost leaves no etcd to remove them through: that is a restore
    from a backup or a zone removal, never an edit (README: Lost machines)."""
    cps = [i for i, m in enumerate(machines) if m.pool == CONTROL_PLANE_POOL]
    if cps and all(machines[i].lost for i in cps):
        errs.add(path, "every control-plane machine is marked lost: no control plane is left to remove them "
                 "through. Restore the zone's etcd onto new machines (`python -m kontinuum restore`, README: Lost "
                 "machines) or remove the zone")


def _pool(raw: dict, name: str) -> Pool:
    return Pool(name, raw.get("replicas", 1), raw.get("installDisk", "/dev/sda"), dict(raw.get("nodeLabels", {})),
                tuple(raw.get("patches", ())))


def _source(raw: dict, default: dict) -> ChartSource:
    if raw.get("path"):
        return ChartSource(chart=raw.get("chart", ""), namespace=raw.get("namespace", default["namespace"]),
                           path=raw["path"])
    merged = {**default, **raw}
    return ChartSource(chart=merged["chart"], namespace=merged["namespace"], repo=merged["repo"],
                       version=merged.get("version"))


def _addons(raw: dict) -> Addons:
    addons = {key: Addon(_source(raw.get(key, {}).get("chart", {}), DEFAULT_CHARTS[key]),
                         dict(raw.get(key, {}).get("values", {})))
              for key in ("cilium", "certManager")}
    return Addons(addons["cilium"], addons["certManager"],
                  raw.get("gatewayApi", {}).get("source", DEFAULT_GATEWAY_API))


def _zone(raw: dict, path: str, errs: _Errors, region: str = "") -> Zone | None:
    """Cross-field checks of one (schema-checked, defaults-merged) zone, and its typed form."""
    if "zone" not in raw or "talosAddresses" not in raw:
        return None  # reported by the schema check
    cp_raw = raw.get("controlPlane", {})
    cp = _pool(cp_raw, CONTROL_PLANE_POOL)
    workers, names = [], {CONTROL_PLANE_POOL}
    for i, w in enumerate(raw.get("workers", [])):
        if "name" not in w:
            continue
        if w["name"] in names:
            errs.add(f"{path}.workers[{i}].name", f"duplicate pool name {w['name']!r}")
        names.add(w["name"])
        workers.append(_pool(w, w["name"]))
    machines = _machines(raw["talosAddresses"], f"{path}.talosAddresses", names, errs)
    for pool, pool_path in [(cp, f"{path}.controlPlane")] + [
            (w, f"{path}.workers[{i}]") for i, w in enumerate(workers)]:
        listed = sum(m.pool == pool.name and not m.lost for m in machines)
        lost = sum(m.pool == pool.name and m.lost for m in machines)
        if pool.replicas > listed:
            errs.add(f"{pool_path}.replicas", f"{pool.replicas} wanted but {path}.talosAddresses lists {listed} "
                     f"machine{'s' * (listed != 1)} for pool {pool.name!r}"
                     + (f" that {'is' if listed == 1 else 'are'} not marked lost ({lost} more {'is' if lost == 1 else 'are'})"
                        if lost else ""))
    _check_lost(machines, f"{path}.talosAddresses", errs)
    endpoint = cp_raw.get("endpoint")
    if cp.replicas > 1 and endpoint is None:
        errs.add(f"{path}.controlPlane.endpoint",
                 "required with several control planes (a VIP or load balancer in front of them, https://host:6443)")
    talos = raw.get("talosVersion", contract.TALOS_VERSION)
    kubernetes = raw.get("kubernetesVersion", DEFAULT_KUBERNETES_VERSION)
    if problem := support.talos_problem(talos):
        errs.add(f"{path}.talosVersion", problem)
    if problem := support.kubernetes_problem(talos, kubernetes):
        errs.add(f"{path}.kubernetesVersion", problem)
    teardown = raw.get("teardown", {})
    ingress = exposure.ingress(raw.get("ingress", {}), f"{path}.ingress", errs)
    dns = exposure.dns(raw.get("dns", {}), f"{path}.dns", errs)
    backup = raw.get("backup", {})
    up = raw.get("upgrade", {})
    upgrade = Upgrade(up.get("drain", True), up.get("drainControlPlanes", False), up.get("allowDowngrade", False),
                      up.get("installerImage", contract.DEFAULT_INSTALLER))
    handoff = flux.parse(raw["flux"], f"{path}.flux", region, raw["zone"], errs.add) if raw.get("flux") else None
    return Zone(
        zone=raw["zone"], machines=machines, control_plane=cp, endpoint=endpoint, workers=tuple(workers),
        talos_version=talos, kubernetes_version=kubernetes,
        addons=_addons(raw.get("addons", {})),
        patches=tuple(raw.get("patches", ())),
        unregister_instances_on_delete=raw.get("unregisterInstancesOnDelete", False),
        server_image=raw.get("serverImage", DEFAULT_SERVER_IMAGE),
        timeouts={**DEFAULT_TIMEOUTS, **raw.get("timeouts", {})},
        skip_unreachable_cluster=teardown.get("skipUnreachableCluster", False),
        talos_port=raw.get("talosPort", 50000), teardown_wipe=teardown.get("wipe", "state"),
        ingress=ingress, dns=dns, upgrade=upgrade, flux=handoff,
        max_unavailable=raw.get("rollout", {}).get("maxUnavailable", 1),
        backup=Backup(on_up=backup.get("onUp", False), destination=_backup_destination(backup, path, errs),
                      keep=backup.get("keep", BACKUP_KEEP)),
        renew_before_days=raw.get("certificates", {}).get("renewBefore", RENEW_BEFORE_DAYS),
        rotate=dict(raw.get("certificates", {}).get("rotate") or {}),
    )


def _hub(raw: dict | None) -> Hub | None:
    if not raw or not {"dnsDomain", "grpcEndpoint", "acme"} <= raw.keys() or "email" not in raw["acme"]:
        return None
    auth = raw.get("auth")
    if auth and auth.get("mode") == "oidc":
        oidc = auth.get("oidc", {})
        auth = Auth("oidc", oidc.get("issuerUrl"), oidc.get("clientId"))
    elif auth and auth.get("mode") == "anonymous":
        auth = Auth("anonymous")
    else:
        auth = None
    return Hub(raw["dnsDomain"], raw["grpcEndpoint"], raw["acme"]["email"], raw["acme"].get("server", LETSENCRYPT),
               auth, raw["acme"].get("caBundle"))


def _read_ca_bundle_file(raw: dict, errs) -> dict:
    """hub.acme.caBundleFile read into hub.acme.caBundle (then checked as PEM like it)."""
    hub = raw.get("hub")
    acme = hub.get("acme") if isinstance(hub, dict) else None
    if not isinstance(acme, dict) or acme.get("caBundleFile") is None:
        return raw
    path = str(acme["caBundleFile"])
    if acme.get("caBundle") is not None:
        errs.add("hub.acme.caBundleFile", "set either hub.acme.caBundle or hub.acme.caBundleFile, not both")
        return raw
    try:
        text = Path(path).read_text()
    except OSError as e:
        errs.add("hub.acme.caBundleFile", f"cannot read {path} ({e.strerror}); give the PEM file of the CA that "
                 "signs the ACME server's certificate (for the lab: run `python -m lab up` first)")
        return raw
    return {**raw, "hub": {**hub, "acme": {**acme, "caBundle": text}}}


def _plain_secrets(raw: dict, secret_keys: frozenset[str], errs: _Errors) -> None:
    """Secret values nested in zones/defaults (flux credentials) that are stored in plain text."""
    for key in ("defaults", "zones"):
        if key not in raw:
            continue
        for path in flux.secret_paths(contract.STACK.fields[key], raw[key], key):
            if not flux.is_secret(path, secret_keys):
                errs.add(path, "is plain text in the stack config; store it as a Pulumi secret: "
                         f"`pulumi config set --secret --path '{contract.NAMESPACE}:{path}' < file` "
                         "(and remove the plain value from the file's history)")


SECRET_KEYS = tuple(k for k, f in contract.STACK.fields.items() if f.secret)


def problems(raw: dict, *, secret_keys: frozenset[str] | None = None) -> tuple[StackConfig | None, list[ConfigError]]:
    """The typed config (None when unusable) and every problem, each with its path.

    raw: the `kontinuum:` keys without their namespace. secret_keys: those set with
    `--secret` (None: unknown, e.g. in unit tests; then plain-text secrets are not judged)."""
    errs = _Errors()
    known = list(contract.STACK.fields)
    for key in raw:
        if key not in contract.STACK.fields:
            hint = schema.suggest(key, known).replace("mean ", f"mean {contract.NAMESPACE}:")
            errs.add(f"{contract.NAMESPACE}:{key}", hint)
    for key in SECRET_KEYS:
        if secret_keys is not None and key in raw and key not in secret_keys:
            errs.add(f"{contract.NAMESPACE}:{key}", "is plain text in the stack config; store it as a secret: "
                     f"`pulumi config rm {contract.NAMESPACE}:{key}` then "
                     f"`pulumi config set --secret {contract.NAMESPACE}:{key} < hub-kubeconfig.yaml`")
    raw = _read_ca_bundle_file(raw, errs)
    if raw.get("hubKubeconfig") is not None and raw.get("hubKubeconfigFile") is not None:
        errs.add(f"{contract.NAMESPACE}:hubKubeconfigFile", "set either kontinuum:hubKubeconfig (a secret) or "
                 "kontinuum:hubKubeconfigFile, not both")
    fields = contract.STACK.fields
    clean = {}
    for key, f in fields.items():
        if key in raw and raw[key] is not None and key not in ("defaults", "zones"):
            value = schema.check(f, raw[key], key, errs)
            if value is not None:
                clean[key] = value
        elif f.required and raw.get(key) is None:
            errs.add(f"{contract.NAMESPACE}:{key}" if key == "region" else key,
                     "required" if key == "region" else "required: dnsDomain, grpcEndpoint, acme and auth of the hub")
    if secret_keys is not None:
        _plain_secrets(raw, secret_keys, errs)
    # `defaults` are checked once, under `defaults.…`; each zone on its own before the merge.
    defaults = schema.check(fields["defaults"], raw.get("defaults") or {}, "defaults", errs) or {}
    raw_zones = raw.get("zones") if raw.get("zones") is not None else []
    if not isinstance(raw_zones, list):
        schema.check(fields["zones"], raw_zones, "zones", errs)
        raw_zones = []
    zones, index, seen, addresses = [], [], {}, {}
    for i, rz in enumerate(raw_zones):
        checked = schema.check(contract.ZONE, rz, f"zones[{i}]", errs)
        if checked is None:
            continue
        z = _zone(_merge(defaults, checked), f"zones[{i}]", errs, region=clean.get("region", ""))
        if z is None:
            continue
        if z.zone in seen:
            errs.add(f"zones[{i}].zone", f"zone {z.zone!r} is listed twice (also zones[{seen[z.zone]}])")
        seen.setdefault(z.zone, i)
        for j, m in enumerate(z.machines):
            for a in m.addresses:
                if a in addresses:
                    errs.add(f"zones[{i}].talosAddresses[{j}]", f"{a} is already used by {addresses[a]}")
                else:
                    addresses[a] = f"zones[{i}].talosAddresses[{j}] (zone {z.zone})"
        zones.append(dataclasses.replace(z, path=f"zones[{i}]"))
        index.append(i)
    hub = _hub(clean.get("hub"))
    keys = _tsig_keys(clean.get("dnsTsigKeys"), secret_keys, errs)
    exposure.check_region(clean.get("region"), hub, zones, index, keys, clean.get("dnsTsigKeys"), errs)
    if zones and hub is not None and hub.auth is None and "auth" not in (raw.get("hub") or {}):
        errs.add("hub.auth", "not configured: a zone's kontinuum-server refuses to start without the hub's auth "
                 "choice; set hub.auth.mode to anonymous or oidc")
    if hub and hub.auth and hub.auth.mode == "oidc" and not (clean["hub"]["auth"].get("oidc")):
        errs.add("hub.auth.oidc", "required with mode: oidc (issuerUrl, clientId)")
    if "region" not in clean or hub is None:
        return None, list(errs)
    return StackConfig(clean["region"], hub, tuple(zones), tuple(index),
                       clean.get("allowEmptyRegion", False), keys or {}), list(errs)


SECRET_PLACEHOLDER = "<secret>"  # what the offline check (validation.read_stack_file) sees of a `secure:` value


def _tsig_keys(text: str | None, secret_keys: frozenset[str] | None, errs: _Errors) -> dict | None:
    """The parsed keys; None when they cannot be judged (unset, or a secret the offline check cannot read)."""
    if text is None or (text == SECRET_PLACEHOLDER and secret_keys is not None and "dnsTsigKeys" in secret_keys):
        return None
    try:
        return tsig.parse(text)
    except tsig.TsigKeyError as e:
        errs.add(f"{contract.NAMESPACE}:dnsTsigKeys", str(e))
        return None


def parse(raw: dict, *, secret_keys: frozenset[str] | None = None) -> StackConfig:
    """Validate the whole `kontinuum:` config; raises ConfigErrors listing every problem."""
    stack, errs = problems(raw, secret_keys=secret_keys)
    if errs:
        raise ConfigErrors(errs)
    assert stack is not None
    return stack


def _backup_destination(backup: dict, path: str, errs) -> str:
    """`backup.destination`, or its older name `directory`; not both."""
    if "destination" in backup and "directory" in backup:
        errs.add(f"{path}.backup.directory", "give `destination` or its older name `directory`, not both")
    return backup.get("destination") or backup.get("directory") or BACKUP_DIRECTORY
