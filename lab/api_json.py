"""Reading objects as the API's JSON (the lab's passes list them so: lab.standins.loop.list_json)."""

from __future__ import annotations


def condition(obj: dict, kind: str) -> dict | None:
    """The status condition of type `kind` (Ready, PodScheduled, ...), or None."""
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def is_ready(obj: dict) -> bool:
    """Whether a Node's or Pod's Ready condition is True."""
    return (condition(obj, "Ready") or {}).get("status") == "True"


def matches(obj: dict, selector: str) -> bool:
    """Whether the object's labels satisfy an equality-based label selector ("k=v,k2=v2"), as the
    API would for a list with that selector: one list of a pass serves several readers."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, sep, value = term.partition("=")
        if not sep or key.endswith("!") or value.startswith("="):
            raise ValueError(f"only k=v terms are read here, not {term!r}")
        if labels.get(key.strip()) != value.strip():
            return False
    return True
