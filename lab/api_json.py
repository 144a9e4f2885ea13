"""Reading objects as the API's JSON (the lab's passes list them so: lab.standins.loop.list_json)."""

from __future__ import annotations


def condition(obj: dict, kind: str) -> dict | None:
    """The status condition of type `kind` (Ready, PodScheduled, ...), or None."""
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def is_ready(obj: dict) -> bool:
    """Whether a Node's or Pod's Ready condition is True."""
    return (condition(obj, "Ready") or {}).get("status") == "True"
