"""The supervised loop helper: one pass at a time, failures counted and backed off, cancellation honoured,
liveness visible to /readyz and /metrics."""
from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hub.loops import Background, Loops


async def _until(pred, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if pred():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def test_a_failing_pass_is_counted_logged_and_the_loop_goes_on():
    calls = []

    async def step():
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("database went away")
        return 0.01

    registry = CollectorRegistry()
    loops = Loops(registry, backoff_max_s=0.02)
    loops.start("flaky", step, interval_s=0.01)
    await _until(lambda: len(calls) >= 4)
    state = loops.loops["flaky"]
    assert state.failures == 2 and state.consecutive_failures == 0 and state.steps >= 2
    assert loops.problems() == []
    text = generate_latest(registry).decode()
    assert 'amux_loop_failures_total{loop="flaky"} 2.0' in text
    await loops.stop()


async def test_a_loop_failing_every_pass_makes_the_replica_unready_until_a_pass_succeeds():
    healthy = asyncio.Event()

    async def step():
        if not healthy.is_set():
            raise OSError("connection refused")
        return 0.01

    loops = Loops(unready_after=3, backoff_max_s=0.01)
    loops.start("dispatch", step, interval_s=0.01)
    await _until(lambda: loops.loops["dispatch"].consecutive_failures >= 3)
    assert any("dispatch failed its last" in p for p in loops.problems())
    healthy.set()
    await _until(lambda: loops.loops["dispatch"].consecutive_failures == 0)
    assert loops.problems() == []
    await loops.stop()


async def test_a_loop_whose_task_ended_is_reported_stopped():
    async def step():
        raise asyncio.CancelledError  # cancellation is re-raised, never swallowed as a failure

    loops = Loops()
    loops.start("gone", step, interval_s=1)
    await _until(lambda: loops.loops["gone"].stopped)
    assert loops.problems() == ["loop gone stopped"]
    assert loops.loops["gone"].failures == 0
    await loops.stop()


async def test_a_step_with_a_backlog_yields_to_the_event_loop_between_passes():
    passes = 0

    async def busy():
        nonlocal passes
        passes += 1
        return 0.0  # a full batch: run again at once

    loops = Loops()
    loops.start("backlog", busy, interval_s=1)
    ticks = 0
    for _ in range(50):
        await asyncio.sleep(0)
        ticks += 1
    assert ticks == 50 and passes >= 10  # both made progress: the loop never held the event loop
    await loops.stop()


async def test_a_kick_cuts_the_wait_short():
    wake = asyncio.Event()
    calls = []

    async def step():
        calls.append(1)
        return 3600.0

    loops = Loops()
    loops.start("kicked", step, interval_s=3600, wake=wake)
    await _until(lambda: len(calls) == 1)
    wake.set()
    await _until(lambda: len(calls) == 2)
    await loops.stop()


async def test_the_same_loop_cannot_run_twice():
    async def step():
        return 1.0

    loops = Loops()
    loops.start("one", step, interval_s=1)
    with pytest.raises(ValueError, match="already running"):
        loops.start("one", step, interval_s=1)
    await loops.stop()


async def test_background_tasks_are_held_until_they_end_and_cancelled_on_close():
    tasks = Background("test")
    gate = asyncio.Event()
    done = tasks.spawn(asyncio.sleep(0))
    pending = tasks.spawn(gate.wait())
    await done
    assert len(tasks._tasks) == 1
    await tasks.aclose()
    assert pending.cancelled()



async def test_the_backoff_doubles_per_failure_in_a_row_up_to_the_ceiling_and_restarts_after_a_success(caplog):
    outcomes = iter([RuntimeError("a"), RuntimeError("b"), RuntimeError("c"), RuntimeError("d"), None,
                     RuntimeError("e")])
    done = asyncio.Event()

    async def step() -> float:
        o = next(outcomes, None)
        if isinstance(o, Exception):
            raise o
        if o is None and not done.is_set() and len(caplog.records) >= 5:
            done.set()
        return 0

    loops = Loops(backoff_max_s=0.08)
    with caplog.at_level(logging.ERROR, logger="amux.loops"):
        loops.start("bo", step, interval_s=0.02)
        await asyncio.wait_for(done.wait(), 5)
        await loops.stop()
    waits = [r.args[2] for r in caplog.records if r.getMessage().startswith("loop bo: pass failed")]
    assert waits[:5] == [0.02, 0.04, 0.08, 0.08, 0.02]  # doubling, capped; after a success it starts afresh
    assert all(r.exc_info for r in caplog.records[:5])  # the failure's traceback is logged with it
