"""Names of zone objects (seeds, stage 1), in one place: every zone object is
`<region>-<zone>`, and a machine is the hub Instance `<region>-<zone>-<first 8 hex of
sha256(first address)>`, which is also the name of its resources in the stack."""

from __future__ import annotations

import hashlib


def instance_name(region: str, zone: str, address: str) -> str:
    """The same address is the same Instance, a new address a new one."""
    return f"{region}-{zone}-{hashlib.sha256(address.encode()).hexdigest()[:8]}"
