"""The dynamic-provider host: `python -m pulumi.dynamic`, except that our own errors reach the
engine as their message alone.

The SDK's server answers every failed call with the full traceback, so an expected failure
(a zone cluster that does not answer, a discovery that found nothing) reads as `Traceback (most
recent call last): …` before the message that says what to do. A KontinuumError (and its kin,
kontinuum/errors.py) is raised on purpose with that message: only the message is sent. Any other
exception is a bug and keeps its traceback; so does everything with KONTINUUM_DEBUG=1.
Started by tools/plugins/plugin_guard.py (`python -m providers.host` in effect).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from kontinuum.errors import KontinuumError

_format_exc = traceback.format_exc


def format_exc(limit: int | None = None, chain: bool = True) -> str:
    """traceback.format_exc as the SDK's server calls it while handling a failed call."""
    error = sys.exc_info()[1]
    if isinstance(error, KontinuumError) and not os.environ.get("KONTINUUM_DEBUG"):
        return str(error)
    return _format_exc(limit, chain)


def main() -> None:
    traceback.format_exc = format_exc  # the server module looks it up at call time
    runpy.run_module("pulumi.dynamic", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
