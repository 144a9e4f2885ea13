"""A preview plans exactly what the up does (issue 31): the resources a `pulumi preview` plans to
change, and those the `pulumi up` after it changed, each as {(op, urn suffix)}, so a test compares
the two per edit and names any allowed difference."""

from __future__ import annotations

import json
from pathlib import Path

from lab.pulumi_cli import Stack

# The default dynamic provider's inputs are the whole stack config: the up records any config edit
# on it, which the preview's steps never list. It is not a resource of the zone, and nothing is
# done to anything for it.
DEFAULT_PROVIDER = ("update", "pulumi:providers:pulumi-python::default")
CHANGES = ("create", "update", "delete", "replace", "create-replacement", "delete-replaced")


def _key(urn: str) -> str:
    """`<type>::<name>` without the stack and parent chain (types tell a machine's Instance from its ConfigApply)."""
    qualified, name = urn.rsplit("::", 2)[-2:]
    return f"{qualified.rsplit('$', 1)[-1]}::{name}"


def planned(stack: Stack, *extra: str) -> set[tuple[str, str]]:
    out = json.loads(stack.preview("--json", *extra).stdout)
    return {(s["op"], _key(s["urn"])) for s in out.get("steps", []) if s["op"] in CHANGES}


def made(stack: Stack, log: Path, *extra: str) -> set[tuple[str, str]]:
    """`pulumi up` with an event log (needs PULUMI_DEBUG_COMMANDS=true in the stack's env): the
    steps it carried out."""
    log.unlink(missing_ok=True)
    stack.up(f"--event-log={log}", *extra)
    steps = set()
    for line in log.read_text().splitlines():
        try:
            meta = (json.loads(line).get("resOutputsEvent") or {}).get("metadata") or {}
        except ValueError:
            continue
        if meta.get("op") in CHANGES:
            steps.add((meta["op"], _key(meta["urn"])))
    return steps


def compare(stack: Stack, log: Path, *, allowed: dict[tuple[str, str], str] | None = None
            ) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """Preview, then up: asserts the two sets are equal but for `allowed` (step → why it may be
    planned and not made, or made and not planned). Returns (planned, made)."""
    plan = planned(stack)
    did = made(stack, log)
    odd = (plan ^ did) - {DEFAULT_PROVIDER, *(allowed or {})}
    assert not odd, f"preview planned {sorted(plan - did)} that the up did not make; up made {sorted(did - plan)} " \
                    f"that the preview did not plan"
    return plan, did
