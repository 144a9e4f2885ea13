"""Stop the program with one clear message: no traceback, and no engine line saying the
program "exited with non-zero exit code" after it (the pinned executor turns a RunError into
exit code 1, which the engine reports as an unhandled error)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import pulumi

from kontinuum.errors import KontinuumError

# The executor's code for "an error message was shown to the user" (the engine adds nothing).
USER_ACTIONABLE_EXIT = 32


def fail_cleanly(message: str) -> None:
    pulumi.log.error(message)
    raise SystemExit(USER_ACTIONABLE_EXIT)


@contextlib.contextmanager
def our_errors_cleanly() -> Iterator[None]:
    """A KontinuumError (or a RunError, which says the same) raised inside ends the program with
    its message alone; a bug, or any error with KONTINUUM_DEBUG=1, keeps its traceback."""
    try:
        yield
    except (KontinuumError, pulumi.RunError) as e:
        if os.environ.get("KONTINUUM_DEBUG"):
            raise
        fail_cleanly(str(e))
