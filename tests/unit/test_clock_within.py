"""`within` / `sleep_until`: a timeout that never drops a cancellation (Python 3.11's `asyncio.wait_for` does, when
the awaited completes in the same loop turn as the cancel — a loop stopped that way ran on, and the hub's shutdown
waited for it for ever)."""
from __future__ import annotations

import asyncio

import pytest

from hub.clock import sleep_until, within


async def test_a_loop_cancelled_as_its_wake_event_fires_ends_instead_of_running_on():
    wake, passes = asyncio.Event(), []

    async def loop() -> None:
        while True:
            await sleep_until(wake, 10)
            passes.append(1)

    task = asyncio.create_task(loop())
    for _ in range(3):
        await asyncio.sleep(0)
    wake.set()
    task.cancel()  # in the same loop turn as the wake: `asyncio.wait_for` returned True here and the loop ran on
    for _ in range(5):
        await asyncio.sleep(0)
    assert task.cancelled() and passes == []


async def test_within_returns_what_was_awaited_and_raises_timeout_error_when_it_is_late():
    assert await within(asyncio.sleep(0, "done"), 1) == "done"
    assert await within(asyncio.sleep(0, "no limit"), None) == "no limit"
    with pytest.raises(TimeoutError):
        await within(asyncio.Event().wait(), 0.01)
    assert await sleep_until(asyncio.Event(), 0.01) is False
