"""The backoff schedules (tenacity wait strategies): the runner's reconnect and a failing loop's wait."""
from __future__ import annotations

import pytest
from tenacity import RetryCallState

from hub.backoff import RECONNECT, loop_backoff


def _state(attempt: int) -> RetryCallState:
    rs = RetryCallState(None, None, (), {})  # tenacity's waits read only the attempt number
    rs.attempt_number = attempt
    return rs


@pytest.mark.parametrize(("attempt", "base"), [
    (1, 0.1),   # the first reconnect waits 0.1 s
    (2, 0.2),   # doubling
    (3, 0.4),
    (5, 1.6),
    (6, 2.0),   # capped at 2 s
    (50, 2.0),  # and stays there
])
def test_the_runner_reconnects_after_0_1_s_doubling_to_2_s_with_up_to_50_percent_jitter(attempt, base):
    waits = [RECONNECT(_state(attempt)) for _ in range(200)]
    assert all(base <= w <= base * 1.5 for w in waits)
    assert max(waits) - min(waits) > base * 0.2  # jittered: runners cut off together spread out


@pytest.mark.parametrize(("first", "attempt", "wait"), [
    (1.0, 1, 1.0), (1.0, 2, 2.0), (1.0, 9, 2.0),          # a 1 s (or longer) loop: 1 s, then 2 s, capped
    (0.25, 1, 0.25), (0.25, 3, 1.0), (0.25, 4, 2.0), (0.25, 20, 2.0),
])
def test_a_failing_loop_backs_off_doubling_and_is_capped_at_2_s(first, attempt, wait):
    assert loop_backoff(first, 2.0)(_state(attempt)) == wait
