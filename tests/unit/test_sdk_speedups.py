"""The SDK's end-of-program wait, batched (kontinuum_components/sdk_speedups.py)."""

from __future__ import annotations

import asyncio
import threading
from importlib import metadata

import pytest

from kontinuum_components import sdk_speedups


class Settings:
    """What the wait uses of the SDK's SETTINGS: a lock and the set of tracked Output tasks."""

    def __init__(self):
        self.lock = threading.Lock()
        self.outputs: set = set()


def test_written_for_the_pinned_sdk():
    # A new SDK may have fixed or changed its wait: read pulumi/runtime/stack.py wait_for_rpcs
    # again before moving SDK_VERSION (requirements.txt pins the SDK).
    assert metadata.version("pulumi") == sdk_speedups.SDK_VERSION


def test_every_output_is_awaited_including_ones_created_while_waiting():
    finished = []

    async def main():
        settings = Settings()

        async def late(i):
            await asyncio.sleep(0.01)
            finished.append(f"late{i}")

        async def early(i):
            await asyncio.sleep(0.001 * i)
            if i % 10 == 0:  # an Output whose callback makes another Output
                with settings.lock:
                    settings.outputs.add(asyncio.ensure_future(late(i)))
            finished.append(i)

        settings.outputs.update(asyncio.ensure_future(early(i)) for i in range(50))
        await sdk_speedups.wait_for_outputs(settings)
        assert not settings.outputs

    asyncio.run(main())
    assert sorted(x for x in finished if isinstance(x, int)) == list(range(50))
    assert sorted(x for x in finished if isinstance(x, str)) == sorted(f"late{i}" for i in range(0, 50, 10))


def test_a_failed_output_is_raised_without_waiting_for_slow_ones():
    async def main():
        settings = Settings()

        async def slow():
            await asyncio.sleep(30)

        async def boom():
            await asyncio.sleep(0.01)
            raise RuntimeError("the apply failed")

        settings.outputs.update({asyncio.ensure_future(slow()), asyncio.ensure_future(boom())})
        with pytest.raises(RuntimeError, match="the apply failed"):
            await asyncio.wait_for(sdk_speedups.wait_for_outputs(settings), timeout=10)

    asyncio.run(main())


def test_off_switch_keeps_the_sdks_own(monkeypatch):
    import pulumi.log
    from pulumi.runtime import stack

    wait, debug = stack.wait_for_rpcs, pulumi.log.debug
    monkeypatch.setattr(stack, "wait_for_rpcs", wait)  # restored after the test
    monkeypatch.setattr(pulumi.log, "debug", debug)
    monkeypatch.delenv("KONTINUUM_DEBUG", raising=False)
    monkeypatch.setenv("KONTINUUM_SDK_SPEEDUPS", "0")
    assert not sdk_speedups.apply()
    assert (stack.wait_for_rpcs, pulumi.log.debug) == (wait, debug)
    monkeypatch.delenv("KONTINUUM_SDK_SPEEDUPS")
    assert sdk_speedups.apply()
    assert (stack.wait_for_rpcs, pulumi.log.debug) == (sdk_speedups.wait_for_rpcs, sdk_speedups._no_debug)


def test_debug_lines_stay_with_kontinuum_debug(monkeypatch):
    import pulumi.log
    from pulumi.runtime import stack

    debug = pulumi.log.debug
    monkeypatch.setattr(stack, "wait_for_rpcs", stack.wait_for_rpcs)  # restored after the test
    monkeypatch.setattr(pulumi.log, "debug", debug)
    monkeypatch.setenv("KONTINUUM_DEBUG", "1")
    assert sdk_speedups.apply()
    assert pulumi.log.debug is debug
