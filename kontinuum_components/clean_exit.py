"""Stop the program with one clear message: no traceback, and no engine line saying the
program "exited with non-zero exit code" after it (the pinned executor turns a RunError into
exit code 1, which the engine reports as an unhandled error)."""

from __future__ import annotations

import pulumi

# The executor's code for "an error message was shown to the user" (the engine adds nothing).
USER_ACTIONABLE_EXIT = 32


def fail_cleanly(message: str) -> None:
    pulumi.log.error(message)
    raise SystemExit(USER_ACTIONABLE_EXIT)
