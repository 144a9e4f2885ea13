"""Which Talos versions we render for, and which Kubernetes versions each supports.

The one copy of Talos's support matrix for the pinned contract (Talos 1.13: Kubernetes
1.31–1.36, pkg/machinery/compatibility/talos113; reference/day2-facts.md). Stack config
validation and the README read it from here.
"""

from __future__ import annotations

import re

# Talos minor -> (oldest, newest) Kubernetes minor it supports, both inclusive.
KUBERNETES_BY_TALOS = {"1.13": ("1.31", "1.36")}


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"^v?(\d+)\.(\d+)(\.\d+)?", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _text(minor: tuple[int, int]) -> str:
    return f"{minor[0]}.{minor[1]}"


def talos_problem(talos: str) -> str | None:
    """Why this Talos version cannot be used, or None."""
    minor = _minor(talos)
    if minor is None or _text(minor) not in KUBERNETES_BY_TALOS:
        known = ", ".join(f"v{t}.x" for t in KUBERNETES_BY_TALOS)
        return f"Talos {talos} is not supported: machine configs follow the pinned contract ({known})"
    return None


def kubernetes_problem(talos: str, kubernetes: str) -> str | None:
    """Why this Kubernetes version cannot run on this Talos version, or None."""
    t, k = _minor(talos), _minor(kubernetes)
    if t is None or k is None or _text(t) not in KUBERNETES_BY_TALOS:
        return None  # the Talos version is reported on its own
    low, high = (_minor(v) for v in KUBERNETES_BY_TALOS[_text(t)])
    if not low <= k <= high:
        return (f"Kubernetes {kubernetes} is not supported by Talos {talos} "
                f"(supported: {_text(low)}–{_text(high)})")
    return None


def matrix_text() -> str:
    """The matrix as README prose, e.g. `Talos 1.13: Kubernetes 1.31–1.36`."""
    return "; ".join(f"Talos {t}: Kubernetes {lo}–{hi}" for t, (lo, hi) in KUBERNETES_BY_TALOS.items())
