"""Two changes to how the pinned Pulumi Python SDK runs a program, for what a region costs.

After the program body ran, the SDK (`pulumi.runtime.stack.wait_for_rpcs`, 3.272.0) waits for
every outstanding Output with `asyncio.wait(all_pending, FIRST_COMPLETED)` in a loop: each
round attaches a callback to every pending task, returns when ONE finished, then puts the rest
back. With N outstanding Outputs (several per resource) that is O(N²) callback work: in a
50-zone preview (1753 resources) it was most of the program's CPU (bench/RESULTS.md, preview50).

`wait_for_outputs` below waits for each batch with FIRST_EXCEPTION instead: the same tasks, the
same order of failure reporting (the first failed task is re-raised), new Outputs created while
waiting picked up in the next round, RPCs drained first exactly as the SDK does. Applied only to
the SDK version it was written against (`SDK_VERSION`); on any other the SDK's own runs and
tests/unit/test_sdk_speedups.py says so.

The SDK also sends the engine a debug line for nearly every step of every registration
("registering resource", "resource registration prepared", …), each a blocking gRPC call on
the program's event loop that the engine then logs and drops unless run with --debug: four or
more round trips per resource. They are dropped here unless `KONTINUUM_DEBUG=1`; our own
messages are info/warning/error and unaffected.

`KONTINUUM_SDK_SPEEDUPS=0` keeps the SDK's own behaviour for both (side-by-side measurement in
bench/).
"""

from __future__ import annotations

import asyncio
import os
from importlib import metadata

SDK_VERSION = "3.272.0"


async def wait_for_rpcs(await_all_outstanding_tasks: bool = True) -> None:
    from pulumi.runtime.settings import SETTINGS, _get_rpc_manager

    rpc_manager = _get_rpc_manager()
    while True:
        while len(rpc_manager.rpcs) > 0:
            await asyncio.sleep(0)
            try:
                await rpc_manager.rpcs.pop()
            except Exception as exn:
                if rpc_manager.unhandled_exception is not None:
                    raise exn from rpc_manager.unhandled_exception.with_traceback(rpc_manager.exception_traceback)
                raise
        if rpc_manager.unhandled_exception is not None:
            raise rpc_manager.unhandled_exception.with_traceback(rpc_manager.exception_traceback)
        if await_all_outstanding_tasks:
            await wait_for_outputs(SETTINGS)
        if len(rpc_manager.rpcs) == 0:
            break


async def wait_for_outputs(settings) -> None:
    """Await every tracked Output task, a batch at a time: O(N) per batch, not per task."""
    while True:
        with settings.lock:
            if len(settings.outputs) == 0:
                return
            pending = list(settings.outputs)
            settings.outputs.clear()
        # Returns when all are done or one failed; awaiting the done ones re-raises that failure.
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            await task


def _no_debug(*_args, **_kwargs) -> None:
    """The SDK's internal debug lines, not sent (KONTINUUM_DEBUG=1 sends them)."""


def apply() -> bool:
    """Install both when the SDK is the pinned one; True when installed."""
    import pulumi.log
    from pulumi.runtime import stack

    if metadata.version("pulumi") != SDK_VERSION or os.environ.get("KONTINUUM_SDK_SPEEDUPS") == "0":
        return False
    stack.wait_for_rpcs = wait_for_rpcs
    if not os.environ.get("KONTINUUM_DEBUG"):
        pulumi.log.debug = _no_debug
    return True
