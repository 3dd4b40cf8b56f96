"""In-process wake-ups; an optimization over polling the database, never the source of truth."""
from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Callable
from ..clock import within


def task_key(task_id: str) -> str:
    """Notifier key for a task's changes."""
    return f"task:{task_id}"


class Notifier:
    """Wake waiters on this replica when a key changes; other replicas fall back to polling."""

    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._listeners: list[tuple[str, Callable[[str], None]]] = []

    def listen(self, prefix: str, callback: Callable[[str], None]) -> None:
        """Call `callback(key)` on every notify of a key that starts with `prefix` (one loop serving many keys)."""
        self._listeners.append((prefix, callback))

    def notify(self, key: str) -> None:
        """Wake every waiter on `key`, and the listeners of its prefix. Call it from the event loop, after the
        transaction that made the change commits (never from a transaction body: on SQLite that runs on the
        database's thread)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(f"notify({key!r}) outside the event loop: notify after the transaction commits, "
                               "not inside its body") from None
        for ev in self._events.pop(key, ()):
            ev.set()
        for prefix, callback in self._listeners:
            if key.startswith(prefix):
                callback(key)

    async def wait(self, key: str, timeout: float) -> bool:
        """Wait for a notify on `key` or `timeout` seconds; return whether notified."""
        ev = asyncio.Event()
        self._events[key].add(ev)
        try:
            await within(ev.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            waiters = self._events.get(key)
            if waiters is not None:
                waiters.discard(ev)
                if not waiters:
                    self._events.pop(key, None)
