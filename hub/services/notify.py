"""In-process wake-ups; an optimization over polling the database, never the source of truth."""
from __future__ import annotations

import asyncio
from collections import defaultdict


class Notifier:
    """Wake waiters on this replica when a key changes; other replicas fall back to polling."""

    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = defaultdict(set)

    def notify(self, key: str) -> None:
        """Wake every waiter on `key`."""
        for ev in self._events.pop(key, ()):
            ev.set()

    async def wait(self, key: str, timeout: float) -> bool:
        """Wait for a notify on `key` or `timeout` seconds; return whether notified."""
        ev = asyncio.Event()
        self._events[key].add(ev)
        try:
            await asyncio.wait_for(ev.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            waiters = self._events.get(key)
            if waiters is not None:
                waiters.discard(ev)
                if not waiters:
                    self._events.pop(key, None)
