"""Backoff schedules for reconnects and failing loops, as tenacity wait strategies (one place for the numbers)."""
from __future__ import annotations

import random

from tenacity import RetryCallState, wait_exponential
from tenacity.wait import wait_base


class wait_jittered_exponential(wait_base):  # named like tenacity's own strategies
    """Wait `initial` doubling per attempt up to `max`, plus up to `jitter` of that (0.5: 0.1–0.15 s, …, 2–3 s), so
    runners cut off together do not come back together (tenacity's `wait_exponential_jitter` adds a fixed jitter
    and clips it away at the cap)."""

    def __init__(self, initial: float, max: float, jitter: float = 0.5) -> None:  # tenacity's word
        self.base = wait_exponential(multiplier=initial, min=initial, max=max)
        self.jitter = jitter

    def __call__(self, retry_state: RetryCallState) -> float:
        delay = float(self.base(retry_state))
        return delay + random.random() * delay * self.jitter


RECONNECT = wait_jittered_exponential(initial=0.1, max=2.0)
"""The runner's reconnect: 0.1 s doubling to 2 s, with up to 50 % jitter."""


def loop_backoff(first_s: float, max_s: float) -> wait_exponential:
    """A failing loop's wait: `first_s` doubling per failure in a row, capped at `max_s`."""
    return wait_exponential(multiplier=first_s, min=first_s, max=max_s)
