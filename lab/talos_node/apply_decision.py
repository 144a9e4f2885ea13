"""Live or reboot: what a configured Talos 1.13 node decides for an applied machine config.

Our own Python for Talos's `(*Runtime).CanApplyImmediate`
(internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_runtime.go, checked at tag v1.13.0,
commit b9e9c657963363da73b897c27ef3d407ba5e91c0; identical at v1.13.9, 3ebd10a7): only the
v1alpha1 documents of the running and the new config are compared; every field Talos can change
live is copied from the running document into a copy of the new one, and whatever difference
is left needs a reboot. Other documents never force a reboot. The machine features that can
change live are copied only when both documents have a `machine.features` block, so adding or
removing the block needs a reboot.

Talos compares decoded Go structs (reflect.DeepEqual); we compare decoded YAML, with a key set
to null taken as absent (a nil pointer, slice or map in Go). An explicit empty value (`[]`,
`{}`) stays different from an absent one, as a non-nil empty slice, map or struct pointer is in
Go. One known gap: a plain string or number set to its zero value (`token: ""`) equals an
absent one in Go but not here.

The diff texts are our own: a unified diff of YAML with sorted keys (reordering is no change),
headed `--- a` / `+++ b` as Talos's textdiff heads it, not Talos's encoder output byte for byte.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass

import yaml

LIVE_TOP = ("debug", "cluster")
LIVE_MACHINE = (
    "ca", "acceptedCAs", "time", "certSANs", "install", "network", "sysfs", "sysctls", "logging",
    "controlPlane", "kubelet", "kernel", "registries", "pods", "seccompProfiles", "nodeAnnotations",
    "nodeLabels", "nodeTaints",
)
LIVE_FEATURES = ("kubernetesTalosAPIAccess", "kubePrism", "hostDNS", "imageCache", "nodeAddressSortAlgorithm")
IMMEDIATE_REFUSED = "this config change can't be applied in immediate mode"
DETAILS = {
    "reboot": "Applied configuration with a reboot",
    "no-reboot": "Applied configuration without a reboot",
    "try": "Applied configuration without a reboot",
    "staged": "Staged configuration to be applied after the next reboot",
}


class RefusedLive(Exception):
    """NO_REBOOT or TRY asked for a change that needs a reboot (Talos answers InvalidArgument)."""


@dataclass(frozen=True)
class Decision:
    live: bool
    reason: str = ""  # Talos's error text: NO_REBOOT's InvalidArgument message, AUTO's reboot reason


@dataclass(frozen=True)
class Resolved:
    mode: str  # reboot | no-reboot | staged | try: what the node does (never auto)
    details: str  # mode_details of the reply (AUTO's reboot reason appended)
    summary: str  # the same without AUTO's reason, as a dry run shows it


def resolve(requested: str, current: bytes | str, new: bytes | str) -> Resolved:
    """The mode a configured node applies `new` in, as Talos's ApplyConfiguration handler picks
    it; raises RefusedLive with Talos's message when NO_REBOOT or TRY would need a reboot."""
    if requested in ("reboot", "staged"):
        return Resolved(requested, DETAILS[requested], DETAILS[requested])
    decision = decide(current, new)
    if requested in ("no-reboot", "try"):
        if not decision.live:
            raise RefusedLive(decision.reason)
        return Resolved(requested, DETAILS[requested], DETAILS[requested])
    if decision.live:  # auto
        return Resolved("no-reboot", DETAILS["no-reboot"], DETAILS["no-reboot"])
    return Resolved("reboot", f"{DETAILS['reboot']}: {decision.reason}", DETAILS["reboot"])


def dry_run_details(resolved: Resolved, current: bytes | str, new: bytes | str) -> str:
    """A dry run's mode_details: the summary (no AUTO reason) and the whole config's diff."""
    diff = config_diff(current, new) or "No changes."
    return f"Dry run summary:\n{resolved.summary} (skipped in dry-run).\nConfig diff:\n\n{diff}"


def documents(data: bytes | str) -> list[object]:
    return [d for d in yaml.safe_load_all(data) if d is not None]


def v1alpha1(docs: list[object]) -> dict | None:
    return next((d for d in docs if isinstance(d, dict) and d.get("version") == "v1alpha1" and "kind" not in d), None)


def _normal(value: object) -> object:
    """Null-valued keys dropped at every level (absent and null decode alike in Go)."""
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def _copy_keys(dst: dict, src: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in src:
            dst[key] = copy.deepcopy(src[key])
        else:
            dst.pop(key, None)


def decide(current: bytes | str, new: bytes | str) -> Decision:
    """Whether `new` can replace the running `current` config without a reboot."""
    old_doc, new_doc = v1alpha1(documents(current)), v1alpha1(documents(new))
    if old_doc is None:
        return Decision(False, "current config is not v1alpha1")
    if new_doc is None:
        return Decision(False, "new config is not v1alpha1")
    old_doc, patched = _normal(old_doc), copy.deepcopy(_normal(new_doc))
    _copy_keys(patched, old_doc, LIVE_TOP)
    old_machine, new_machine = old_doc.get("machine"), patched.get("machine")
    if isinstance(old_machine, dict) and isinstance(new_machine, dict):
        _copy_keys(new_machine, old_machine, LIVE_MACHINE)
        old_features, new_features = old_machine.get("features"), new_machine.get("features")
        if isinstance(old_features, dict) and isinstance(new_features, dict):
            _copy_keys(new_features, old_features, LIVE_FEATURES)
    if patched == old_doc:
        return Decision(True)
    return Decision(False, f"{IMMEDIATE_REFUSED}\ndiff:\n{unified(_dump([old_doc]), _dump([patched]))}")


def config_diff(current: bytes | str, new: bytes | str) -> str:
    """The whole multi-document difference, as a dry run shows it ("" when none)."""
    return unified(_dump(documents(current)), _dump(documents(new)))


def _dump(docs: list[object]) -> str:
    return yaml.safe_dump_all([_normal(d) for d in docs], sort_keys=True, default_flow_style=False)


def unified(old: str, new: str) -> str:
    if old == new:
        return ""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), "a", "b")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
