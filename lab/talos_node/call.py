"""What rpc.py hands every handler (api.py, upgrade.py) along with the request: who called, and
what to do once the reply is on the wire (a reboot must not cut its own reply off)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Call:
    """One admitted call on the node that handles it."""

    roles: frozenset[str]
    after_reply: list[Callable[[], None]] = field(default_factory=list)
