"""Bounded waits for conditions on Talos nodes, and the one place their default bounds live.

A wait retries a probe until it returns, the probe raises something other than NotYet (a
fatal error, passed through), or the bound runs out. Past the bound WaitTimeout names the
condition, what the last try saw and what to do (DESIGN §4). Each try gets at most the time
that is left, so the whole wait never overruns its bound by more than one short pause, and no
later try starts with less than `last_try` left: a try cut to a fraction of a second only times
out, and its "no answer" would hide what the tries before it saw.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from kontinuum.errors import KontinuumError

T = TypeVar("T")


@dataclass(frozen=True)
class WaitBounds:
    """Default bounds, in seconds, of the waits the Talos providers make. Real hardware
    installs to disk and reboots after its first config, and brings the apiserver up minutes
    after bootstrap, hence the generous values; every one is an input of its resource."""

    apply: float = 900.0  # config applied → node rebooted → answers over mTLS
    reset: float = 600.0  # reset sent → node back in maintenance mode
    bootstrap: float = 120.0  # node accepts Bootstrap (or says it already ran)
    kubeconfig: float = 900.0  # Kubeconfig RPC answers and its apiserver serves /version
    health: float = 900.0  # Talos's own cluster health check (server wait_timeout)
    reboot_notice: float = 30.0  # to see a node go down after an apply that reboots it
    http_request: float = 5.0  # one try of an HTTP call inside a wait
    first_pause: float = 0.25  # pause after the first failed try; grows 1.5x per try
    max_pause: float = 2.0
    last_try: float = 1.0  # the least time a try after the first is started with


WAIT_DEFAULTS = WaitBounds()


class NotYet(Exception):
    """Raised by a probe: the condition does not hold yet; `observation` says what it saw."""

    def __init__(self, observation: str) -> None:
        super().__init__(observation)
        self.observation = observation


class WaitTimeout(KontinuumError):
    def __init__(self, condition: str, bound: float, last: str, remedy: str) -> None:
        self.condition = condition
        self.bound = bound
        self.last = last
        self.remedy = remedy
        super().__init__(f"{condition}: not reached within {bound:g} s; last observation: {last}. {remedy}")


def wait_until(
    condition: str,
    probe: Callable[[float], T],
    *,
    timeout: float,
    remedy: str,
    started: float | None = None,
    bounds: WaitBounds = WAIT_DEFAULTS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `probe(seconds_left)` until it returns a value, at least once and for at most
    `timeout` seconds. The probe raises NotYet while the condition does not hold.

    Steps of one operation share its bound by passing the same `started` (a `clock()`
    reading): each step then gets what the earlier ones left."""
    deadline = (clock() if started is None else started) + timeout
    pause = bounds.first_pause
    last = "no try finished"
    while True:
        try:
            return probe(max(deadline - clock(), 0.1))
        except NotYet as exc:
            last = exc.observation
        left = deadline - clock()
        if left < bounds.last_try:
            raise WaitTimeout(condition, timeout, last, remedy)
        sleep(min(pause, left - bounds.last_try))
        pause = min(pause * 1.5, bounds.max_pause)
