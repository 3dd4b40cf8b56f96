"""Supervised background loops: one helper runs every loop of a replica and reports their liveness.

A loop is a named `step` run forever: the step does one pass and says how long to wait before the next; the
supervisor re-raises cancellation, logs and counts a failed pass, backs off (tenacity: doubling up to a ceiling) and
runs the step again. A loop whose task ended, or that failed its last `unready_after` passes in a row, makes the
replica unready (`/readyz`); `/metrics` carries steps, failures and liveness per loop.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from .backoff import loop_backoff
from .clock import sleep_until

log = logging.getLogger("amux.loops")

Step = Callable[[], Awaitable[float | None]]
"""One pass of a loop; returns the seconds to wait before the next pass (0: at once), or None for the interval."""


@dataclass(kw_only=True)
class LoopState:
    """What the supervisor knows of one loop (monotonic seconds)."""

    name: str
    interval_s: float
    steps: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_ok: float | None = None
    last_error: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def stopped(self) -> bool:
        """Say whether the loop's task has ended (it never should while the replica runs)."""
        return self.task is not None and self.task.done()

    def view(self) -> dict[str, object]:
        """The loop's state as `/readyz` shows it."""
        return {"name": self.name, "running": not self.stopped, "steps": self.steps, "failures": self.failures,
                "consecutive_failures": self.consecutive_failures, "last_error": self.last_error,
                "last_ok_age_s": None if self.last_ok is None else round(time.monotonic() - self.last_ok, 3)}


class Loops:
    """Start, supervise and stop the background loops of one replica."""

    def __init__(self, registry: CollectorRegistry | None = None, *, unready_after: int = 5,
                 backoff_max_s: float = 2.0) -> None:
        self.unready_after = unready_after
        self.backoff_max_s = backoff_max_s
        self.loops: dict[str, LoopState] = {}
        self._steps = Counter("amux_loop_steps_total", "Passes of each background loop", ["loop"], registry=registry)
        self._failures = Counter("amux_loop_failures_total", "Failed passes of each background loop", ["loop"],
                                 registry=registry)
        self._up = Gauge("amux_loop_up", "1 while a background loop runs and its last passes did not all fail",
                         ["loop"], registry=registry)

    def start(self, name: str, step: Step, *, interval_s: float, wake: asyncio.Event | None = None) -> None:
        """Run `step` forever under `name`; between passes wait the step's answer (or `interval_s`), cut short
        when `wake` is set. The event is cleared before each pass, so a kick during a pass runs one more."""
        if name in self.loops and not self.loops[name].stopped:
            raise ValueError(f"loop {name!r} is already running")
        state = LoopState(name=name, interval_s=interval_s)
        self.loops[name] = state
        state.task = asyncio.create_task(self._run(state, step, wake), name=f"loop:{name}")
        self._up.labels(name).set(1)

    async def _run(self, state: LoopState, step: Step, wake: asyncio.Event | None) -> None:
        async def attempt() -> float | None:
            if wake is not None:
                wake.clear()
            return await step()

        # A failed pass is retried by tenacity: the first wait min(1 s, interval), doubling up to backoff_max_s;
        # cancellation (a BaseException) is never retried. Each successful pass starts the schedule afresh.
        first = min(1.0, state.interval_s) or 0.1
        retrying = AsyncRetrying(retry=retry_if_exception_type(Exception), wait=loop_backoff(first, self.backoff_max_s),
                                 before_sleep=lambda rs: self._failed(state, rs))
        while True:
            wait: float | None = await retrying(attempt)
            state.steps += 1
            state.consecutive_failures = 0
            state.last_ok = time.monotonic()
            self._steps.labels(state.name).inc()
            self._up.labels(state.name).set(1)
            wait = state.interval_s if wait is None else wait
            if wait <= 0:
                await asyncio.sleep(0)  # yield: a loop with a backlog must not starve the event loop
            elif wake is not None:
                await sleep_until(wake, wait)
            else:
                await asyncio.sleep(wait)

    def _failed(self, state: LoopState, rs: RetryCallState) -> None:
        """Count, say and expose one failed pass (the supervisor's job) before tenacity's backoff sleep."""
        e = rs.outcome.exception() if rs.outcome else None
        state.failures += 1
        state.consecutive_failures += 1
        state.last_error = f"{type(e).__name__}: {str(e)[:200]}"
        self._failures.labels(state.name).inc()
        if state.consecutive_failures >= self.unready_after:
            self._up.labels(state.name).set(0)
        log.error("loop %s: pass failed (%d in a row); next in %.1fs", state.name, state.consecutive_failures,
                  rs.next_action.sleep if rs.next_action else 0.0, exc_info=e, extra={"loop": state.name})

    def problems(self) -> list[str]:
        """Say which loops make this replica unready: stopped, or failing every recent pass."""
        out = []
        for s in self.loops.values():
            if s.stopped:
                self._up.labels(s.name).set(0)
                out.append(f"loop {s.name} stopped")
            elif s.consecutive_failures >= self.unready_after:
                out.append(f"loop {s.name} failed its last {s.consecutive_failures} passes ({s.last_error})")
        return out

    def views(self) -> list[dict[str, object]]:
        """Every loop's state, for `/readyz`."""
        return [s.view() for s in self.loops.values()]

    async def stop(self) -> None:
        """Cancel every loop and wait for each to end."""
        tasks = {s.name: s.task for s in self.loops.values() if s.task is not None}
        for t in tasks.values():
            t.cancel()
        for name, t in tasks.items():
            try:
                await t
            except asyncio.CancelledError:
                pass
            except Exception:  # a loop that had died already: its failure was logged by problems()/readyz
                log.exception("loop %s ended with an error", name, extra={"loop": name})
        self.loops.clear()


class Background:
    """Keep a reference to every fire-and-forget asyncio task until it ends (asyncio holds only weak ones), log its
    failure, and cancel what is left on `aclose()`. (An asyncio task: neither a TaskRun nor a lease task.)"""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[object]] = set()

    def spawn(self, coro: Awaitable[object]) -> asyncio.Task[object]:
        """Run `coro` in the background, holding it until it ends."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: background task failed", self.name, exc_info=task.exception())

    async def aclose(self) -> None:
        """Cancel the tasks still running and wait for them."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
