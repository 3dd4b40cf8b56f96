"""Per-key rate limits in fixed windows, with `now` passed in: who may register, and whose bad requests are logged.

A key's window opens at its first event and lasts `window_s`; up to `limit` events pass in it, the rest are
refused with the seconds left until the window closes (an HTTP `Retry-After`). The table is bounded: past
`max_keys` keys, closed windows go first, then the oldest ones, so a flood of new keys costs memory only up to
that bound (and at worst forgets a limited key early).
"""
from __future__ import annotations

import math
from datetime import datetime
from typing import Hashable


class WindowLimit:
    """Allow `limit` events per key in each window of `window_s` seconds."""

    def __init__(self, limit: int, window_s: float, *, max_keys: int = 10_000) -> None:
        self.limit, self.window_s, self.max_keys = limit, window_s, max_keys
        self._windows: dict[Hashable, tuple[datetime, int]] = {}  # key -> (window start, events in it)

    def hit(self, key: Hashable, now: datetime) -> float | None:
        """Count an event of `key`; return None when it passes, else the seconds until the key may try again."""
        start, count = self._windows.get(key, (now, 0))
        elapsed = (now - start).total_seconds()
        if elapsed >= self.window_s or elapsed < 0:
            self._windows.pop(key, None)  # re-inserted last: the table stays ordered by window start
            start, count, elapsed = now, 0, 0.0
        if count >= self.limit:
            return max(self.window_s - elapsed, 0.001)
        if key not in self._windows and len(self._windows) >= self.max_keys:
            self._shrink(now)
        self._windows[key] = (start, count + 1)
        return None

    def _shrink(self, now: datetime) -> None:
        for key, (start, _) in list(self._windows.items()):
            if (now - start).total_seconds() >= self.window_s:
                del self._windows[key]
        if len(self._windows) >= self.max_keys:
            for key in list(self._windows)[:len(self._windows) // 2]:
                del self._windows[key]


def retry_after(seconds: float) -> str:
    """Format a wait as an HTTP `Retry-After` value (whole seconds, at least 1)."""
    return str(max(1, math.ceil(seconds)))
