"""What a region's preview means to a platform team, derived from the engine's `preview --json`
plan (pure, no I/O): zones added, removed or changed, nodes to be reset, machine configs that
change (path by path, secrets masked), upgrades planned, certificates renewed and CAs rotated
(kontinuum/preview_credentials.py), and where the plan cannot know, "unknown until apply" and why.

The engine prints secrets as "[secret]" in that plan; nothing here reveals more than it does.
Steps are attributed by type (each provider has its own, `pulumi-python:dynamic/<module>:<Name>`)
and by name: every zone resource is named `<region>-<zone>-…`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field

from kontinuum.preview_credentials import Credentials

ZONE = "kontinuum:index:Zone"
CONFIG_APPLY = "pulumi-python:dynamic/talos:ConfigApply"
CONFIG_ROLLOUT = "pulumi-python:dynamic/talos:ConfigRollout"
INSTANCE = "pulumi-python:dynamic/hub:Instance"
KUBECONFIG = "pulumi-python:dynamic/talos:Kubeconfig"
TALOS_SECRETS = "pulumi-python:dynamic/talos:TalosSecrets"
CERTIFICATE = "kubernetes:cert-manager.io/v1:Certificate"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
DRIFT = "drift: "  # how ConfigApply's read marks a node found without its config (providers/config_apply.py)
VIEW = "configView"  # ConfigApply's redacted machine config (path → value), kontinuum/talos/config_view.py
CHANGES = ("create", "update", "delete", "replace", "create-replacement", "delete-replaced", "import", "read")
RESETS = ("delete", "replace", "delete-replaced")
# A change of one of these config paths is an upgrade (the install image carries the Talos version).
UPGRADE_PATHS = ("machine.install.image", "cluster.apiServer.image", "cluster.controllerManager.image",
                 "cluster.scheduler.image", "cluster.proxy.image", "machine.kubelet.image")


def step_type(step: dict) -> str:
    return step["urn"].split("::")[2].rsplit("$", 1)[-1]


def step_name(step: dict) -> str:
    return step["urn"].rsplit("::", 1)[-1]


def _state(step: dict, which: str) -> dict:
    return step.get(which) or {}


def _props(step: dict, which: str) -> dict:
    state = _state(step, which)
    return {**(state.get("inputs") or {}), **(state.get("outputs") or {})} if which == "oldState" else \
        dict(state.get("inputs") or {})


@dataclass
class NodeChange:
    zone: str
    node: str  # the machine's address
    pool: str | None
    why: str
    paths: list[str] = field(default_factory=list)  # "path: old → new", secrets masked


@dataclass
class RegionSummary:
    stack: str
    region: str | None = None
    zones_added: list[str] = field(default_factory=list)
    zones_removed: list[str] = field(default_factory=list)
    zones_changed: list[str] = field(default_factory=list)
    nodes_reset: list[NodeChange] = field(default_factory=list)
    nodes_joining: list[NodeChange] = field(default_factory=list)
    configs_changed: list[NodeChange] = field(default_factory=list)
    upgrades: list[str] = field(default_factory=list)
    reboots: list[str] = field(default_factory=list)  # "zone: wave 1: reboot …", the ConfigRollout's plan
    certificates: list[str] = field(default_factory=list)
    addon_values: list[str] = field(default_factory=list)  # "zone release: path old → new"
    objects: list[str] = field(default_factory=list)  # "zone: name (op)", other Kubernetes objects
    counts: dict[str, int] = field(default_factory=dict)
    cluster_compared: bool = True
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    status: str = "no-changes"  # no-changes | changes | invalid | failed

    @property
    def changed(self) -> bool:
        return any(self.counts.get(op) for op in CHANGES)

    @property
    def touches_nothing_running(self) -> bool:
        """Changes that only record something: no node, machine config, reboot, upgrade,
        certificate or release (a rotation token deleted after its rotation, say)."""
        return self.changed and not (self.zones_added or self.zones_removed or self.nodes_reset or self.nodes_joining
                                     or self.configs_changed or self.upgrades or self.reboots or self.certificates
                                     or self.addon_values or self.objects)

    def to_json(self) -> dict:
        return asdict(self)


def _zone_of(name: str, region: str | None, zones: set[str]) -> str | None:
    prefix = f"{region}-" if region else ""
    best = None
    for z in zones:
        full = prefix + z
        if (name == full or name.startswith(full + "-")) and (best is None or len(z) > len(best)):
            best = z
    return best


def view_diff(old: dict | None, new: dict | None) -> list[str]:
    """`path: old → new` for each path of a redacted config view that differs (added/removed
    paths show as ∅)."""
    old, new = old if isinstance(old, dict) else {}, new if isinstance(new, dict) else {}
    out = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a != b:
            out.append(f"{path}: {'∅' if a is None else a} → {'∅' if b is None else b}")
    return out


def settings_diff(old: dict, new: dict) -> list[str]:
    """`key: old → new` for each plain (non-secret, scalar) input that changes."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if k.startswith("__") or k in (VIEW, "configHash") or a == b or a is None and k not in new:
            continue
        if any(isinstance(v, (dict, list)) or v == "[secret]" for v in (a, b)):
            continue
        out.append(f"{k}: {'∅' if a is None else a} → {'∅' if b is None else b}")
    return out


def summarize(stack: str, plan: dict, *, region: str | None, zones: list[str],
              now: dt.datetime | None = None) -> RegionSummary:
    """The summary of one stack's `pulumi preview --json` plan."""
    s = RegionSummary(stack=stack, region=region)
    steps = plan.get("steps") or []
    s.counts = {k: v for k, v in (plan.get("changeSummary") or {}).items() if v}
    known = set(zones) | {step_name(st)[len(region) + 1:] for st in steps
                          if step_type(st) == ZONE and region and step_name(st).startswith(region + "-")}
    now = now or dt.datetime.now(dt.timezone.utc)
    creds = {z: Credentials.of(_props(st, "oldState"), _props(st, "newState"), now) for st in steps
             if step_type(st) == TALOS_SECRETS and st.get("op") == "update"
             and (z := _zone_of(step_name(st), region, known)) is not None}
    unknown: dict[str, list[str]] = {}  # zone -> objects planned only because the provider's kubeconfig is unknown
    changed_zones = set()
    for st in steps:
        op, kind, name = st.get("op"), step_type(st), step_name(st)
        if op not in CHANGES:
            continue
        zone = _zone_of(name, region, known)
        if kind == ZONE:
            (s.zones_added if op == "create" else s.zones_removed if op == "delete" else s.zones_changed).append(
                zone or name)
            continue
        if zone is None:
            continue
        changed_zones.add(zone)
        old, new = _props(st, "oldState"), _props(st, "newState")
        if kind == CONFIG_APPLY:
            node = NodeChange(zone, str(old.get("address") or new.get("address")), old.get("pool") or new.get("pool"),
                              why="")
            if op in RESETS:
                node.why = "leaves the zone: reset to maintenance mode" if op == "delete" else \
                    "replaced: reset to maintenance mode, then configured again"
                s.nodes_reset.append(node)
            elif op == "create":
                node.why = "joins the zone"
                s.nodes_joining.append(node)
            elif op == "update" and str(old.get("configHash") or "").startswith(DRIFT):
                node.why = str(old["configHash"]) + "; its config is applied again"
                s.configs_changed.append(node)
            elif op == "update":
                if isinstance(old.get(VIEW), dict) and isinstance(new.get(VIEW), dict):
                    node.paths = view_diff(old.get(VIEW), new.get(VIEW))
                    node.why = "machine config changes" if node.paths else "settings change (no config sent)"
                elif isinstance(new.get(VIEW), dict):
                    node.why = "records its config view (first run of this version; no config sent if unchanged)"
                else:
                    node.why = "unknown until apply: " + creds.setdefault(zone, Credentials()).unknown_config()
                node.paths += settings_diff(old, new)
                s.configs_changed.append(node)
                for p in node.paths:
                    if p.split(":", 1)[0] in UPGRADE_PATHS:
                        s.upgrades.append(f"{zone} {node.node} ({node.pool}): {p}")
        elif kind == CONFIG_ROLLOUT and op == "update":
            why = creds.setdefault(zone, Credentials()).rotation_cause()
            s.reboots += [f"{zone}: {line}" + (f"; {why}" if why and str(line).startswith("unknown until apply") else "")
                          for line in new.get("plan") or []]
        elif kind == TALOS_SECRETS and op == "update":
            s.certificates += [f"{zone}: {line}" for line in creds[zone].lines()]
        elif kind == KUBECONFIG and op != "create":
            why = creds.setdefault(zone, Credentials()).kubeconfig(old, new, now)
            if why:
                s.certificates.append(f"{zone}: {name} ({why})")
        elif kind.startswith("kubernetes:") and op == "update" and kind != HELM_RELEASE and \
                creds.setdefault(zone, Credentials()).kubeconfig_why:
            unknown.setdefault(zone, []).append(name)  # the provider's config is unknown: not a claim per object
        elif kind == CERTIFICATE and op != "create":
            s.certificates.append(f"{zone}: {name} ({op})")
        elif kind == HELM_RELEASE and op == "update":
            old_v, new_v = old.get("values"), new.get("values")
            lines = view_diff(_flatten(old_v), _flatten(new_v)) if old_v != new_v else []
            s.addon_values += [f"{zone} {name}: {line}" for line in lines] or [
                f"{zone} {name}: unknown until apply: {creds.setdefault(zone, Credentials()).unknown_release()}"]
        elif kind.startswith("kubernetes:"):
            s.objects.append(f"{zone}: {name} ({op})")
    for z, names in unknown.items():
        s.objects.append(f"{z}: {len(names)} objects on the zone's Kubernetes provider: unknown until apply: its "
                         f"kubeconfig is {creds[z].kubeconfig_why}, so the engine cannot compare them at preview "
                         f"({', '.join(names)})")
    for z in sorted(changed_zones):
        if z not in s.zones_added and z not in s.zones_removed:
            s.zones_changed.append(z)
    s.status = "changes" if s.changed else "no-changes"
    return s


def _flatten(value, prefix: str = "") -> dict:
    """Helm values as path → value; the plan already masks secret values as "[secret]"."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out or {prefix: "[]"}
    return {prefix: value if isinstance(value, str) else repr(value)} if prefix else {}


# --- rendering ---------------------------------------------------------------------------------


def markdown(s: RegionSummary, *, drift: bool = False) -> str:
    title = f"### Region `{s.region or '?'}` (stack `{s.stack}`): "
    if s.status == "invalid":
        return title + f"invalid config\n\n```\n{s.error}\n```\n"
    if s.status == "failed":
        return title + f"preview failed\n\n```\n{s.error}\n```\n"
    if not s.changed:
        lines = [title + "no changes"]
    else:
        counts = ", ".join(f"{v} to {k}" for k, v in sorted(s.counts.items()) if k != "same")
        lines = [title + ("drift: " if drift else "") + counts, ""]
        for label, items in (("Zones added", s.zones_added), ("Zones removed", s.zones_removed),
                             ("Zones changed", s.zones_changed)):
            if items:
                lines.append(f"- **{label}:** " + ", ".join(f"`{z}`" for z in items))
        for label, nodes in (("Nodes to be reset", s.nodes_reset), ("Nodes joining", s.nodes_joining),
                             ("Machine configs changing", s.configs_changed)):
            if nodes:
                lines.append(f"- **{label}:**")
                for n in nodes:
                    lines.append(f"  - `{n.zone}` {n.node} (pool {n.pool}): {n.why}")
                    lines += [f"    - `{p}`" for p in n.paths]
        for label, items in (("Reboots planned, in this order", s.reboots), ("Upgrades planned", s.upgrades),
                             ("Certificates renewed, CAs rotated", s.certificates),
                             ("Addon Helm values", s.addon_values), ("Kubernetes objects", s.objects)):
            if items:
                lines.append(f"- **{label}:**")
                lines += [f"  - `{i}`" for i in items]
        if s.touches_nothing_running:
            lines.append("- no changes to any node or release")
    if not s.cluster_compared:
        lines += ["", "_The cluster side was not compared: the zone clusters (or the hub) did not answer from "
                      "here within the bound; Kubernetes objects were diffed against the recorded state only._"]
    lines += [f"_note: {n}_" for n in s.notes]
    return "\n".join(lines) + "\n"


def report(summaries: list[RegionSummary], *, drift: bool = False) -> str:
    head = "## Kontinuum preview" + (" (drift check)" if drift else "")
    return head + "\n\n" + "\n".join(markdown(s, drift=drift) for s in summaries)
