"""The injected clock: every rule with a duration reads time from here."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Awaitable, Protocol, TypeVar, overload

T = TypeVar("T")


class Clock(Protocol):
    """A source of the current time (UTC, timezone-aware)."""

    def now(self) -> datetime:
        """Return the current time; never goes backwards within one process."""


class SystemClock:
    """Read the wall clock."""

    def now(self) -> datetime:
        """Return the current UTC time."""
        return datetime.now(timezone.utc)


class ManualClock:
    """A clock tests advance by hand; starts at a fixed instant."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)

    def now(self) -> datetime:
        """Return the held time."""
        return self._now

    def advance(self, seconds: float = 0, **kw: float) -> datetime:
        """Move time forward and return the new now."""
        self._now += timedelta(seconds=seconds, **kw)
        return self._now

    def set(self, when: datetime) -> None:
        """Jump to an absolute time."""
        self._now = when


@overload
def utc(dt: datetime) -> datetime: ...


@overload
def utc(dt: None) -> None: ...


@overload
def utc(dt: datetime | None) -> datetime | None: ...


def utc(dt: datetime | None) -> datetime | None:
    """Normalize a datetime read back from a store to aware UTC (SQLite drops tzinfo)."""
    if dt is None:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


async def within(aw: Awaitable[T], timeout: float | None) -> T:
    """Await `aw` for at most `timeout` real seconds (None: no limit), else raise TimeoutError: `asyncio.wait_for`
    without its Python 3.11 flaw. There, a cancellation that arrives as `aw` completes is dropped (`wait_for`
    returns the result), so a cancelled loop runs on and whoever awaits it waits for ever; `asyncio.timeout`
    keeps it."""
    async with asyncio.timeout(timeout):
        return await aw


async def sleep_until(event: asyncio.Event, timeout: float) -> bool:
    """Wait for an event or a timeout (real seconds); return whether it fired."""
    try:
        await within(event.wait(), timeout)
        return True
    except TimeoutError:
        return False


def iso(dt: datetime | None) -> str | None:
    """Format a stored time as ISO 8601 in UTC (`…+00:00`), or None; the one formatter every view uses."""
    value = utc(dt)
    return value.isoformat() if value is not None else None
