"""Which Talos upgrades are allowed, from Talos's own compatibility bounds (pure).

For each target minor, Talos's machinery names the oldest version that may upgrade to it and
below which version a downgrade to it is still possible (talos113.go: from 1.11.0; downgrades
from below 1.15.0; reference/day2-facts.md §1). A target outside this table is refused: we
render machine configs for the pinned contract only (kontinuum/talos/support.py).
"""

from __future__ import annotations

import re

# target minor -> (oldest source version, downgrades allowed from versions below this one)
TALOS_UPGRADE_BOUNDS = {"1.13": ("v1.11.0", "v1.15.0")}

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?$")


def parse(version: str) -> tuple[int, int, int, tuple]:
    """Sortable form; a pre-release sorts before its release (v1.13.0-beta.1 < v1.13.0)."""
    m = _VERSION.match(version or "")
    if not m:
        raise ValueError(f"{version!r} is not a version like v1.13.1")
    pre = m.group(4)
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), ((0, pre) if pre else (1, ""))


def minor(version: str) -> str:
    major, min_, *_ = parse(version)
    return f"{major}.{min_}"


def same(a: str, b: str) -> bool:
    try:
        return parse(a) == parse(b)
    except ValueError:
        return a == b


def upgrade_problem(current: str, target: str, *, allow_downgrade: bool) -> str | None:
    """Why a node running `current` must not move to `target`, or None. Says what to do."""
    if same(current, target):
        return None
    try:
        cur, tgt = parse(current), parse(target)
    except ValueError as e:
        return str(e)
    bounds = TALOS_UPGRADE_BOUNDS.get(minor(target))
    if bounds is None:
        known = ", ".join(f"v{m}.x" for m in TALOS_UPGRADE_BOUNDS)
        return f"Talos {target} is not a supported target (supported: {known})"
    oldest, downgrade_below = bounds
    if tgt < cur:
        if not allow_downgrade:
            return (f"{target} is a downgrade from {current}; downgrades are refused unless "
                    "upgrade.allowDowngrade is true")
        if cur >= parse(downgrade_below):
            return f"Talos cannot go back from {current} to {target} (only from versions below {downgrade_below})"
        return None
    if cur < parse(oldest):
        return (f"Talos {current} cannot upgrade to {target} directly (the {minor(target)} upgrade path starts at "
                f"{oldest}); upgrade through the intermediate minor versions first")
    return None


def kubernetes_skew_problem(current: str, target: str) -> str | None:
    """upgrade-k8s's path rule: the same minor or the next one, never back (go-kubernetes'
    upgrade path whitelist; reference/day2-facts.md §2). None when allowed."""
    try:
        cur, tgt = parse(current), parse(target)
    except ValueError as e:
        return str(e)
    if tgt < cur:
        return f"{target} is older than the running {current}; Kubernetes is never downgraded"
    if tgt[0] != cur[0] or tgt[1] > cur[1] + 1:
        step = f"v{cur[0]}.{cur[1] + 1}.x"
        return (f"{current} → {target} skips a minor version; Kubernetes upgrades one minor at a time: "
                f"go to {step} first (run `pulumi up`), then to {target}")
    return None
