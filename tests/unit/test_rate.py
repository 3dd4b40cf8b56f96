"""Fixed-window rate limits: `limit` events per key per window, the wait until the window closes, a bounded table."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from hub.domain.rate import WindowLimit, retry_after

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_a_key_passes_limit_events_per_window_then_waits_until_the_window_closes():
    lim = WindowLimit(3, 60)
    assert [lim.hit("a", at(s)) for s in (0, 1, 2)] == [None, None, None]
    assert lim.hit("a", at(10)) == 50  # the window opened at 0
    assert lim.hit("b", at(10)) is None  # keys are apart
    assert lim.hit("a", at(60)) is None  # a new window
    assert retry_after(50) == "50" and retry_after(0.2) == "1"


def test_the_table_stays_bounded_forgetting_closed_windows_first():
    lim = WindowLimit(1, 60, max_keys=4)
    for i in range(3):
        lim.hit(f"old{i}", at(0))
    lim.hit("limited", at(30))
    assert lim.hit("new", at(61)) is None  # full: the three closed windows go
    assert lim.hit("limited", at(62)) is not None  # an open window survives
    for i in range(10):
        lim.hit(f"flood{i}", at(63))
    assert len(lim._windows) <= 4
