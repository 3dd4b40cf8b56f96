"""Two transactions in a set order: the second starts while the first still holds what it wrote or locked."""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

import sqlalchemy as sa

from hub.store.db import Connection, Database

A = TypeVar("A")
B = TypeVar("B")


async def waiting_on_a_lock(db: Database, timeout_s: float = 10.0) -> None:
    """Return once another transaction of this database waits on a lock (PostgreSQL); SQLite's second writer
    waits on the in-process writer lock, which `race` has taken for the first."""
    if db.is_sqlite:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with db.read() as conn:
            waiting = (await conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"))).scalar()
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the second transaction never waited on the first one's lock")


async def race(db: Database, first: Callable[[Connection], Awaitable[A]],
               second: Callable[[Connection], Awaitable[B]]) -> tuple[A, B]:
    """Run `first` in a write transaction and keep it open until `second`, in its own write transaction, waits
    on it; then commit `first` and let `second` finish. Return both results."""
    inside, go = asyncio.Event(), asyncio.Event()

    async def run_first() -> A:
        async with db.write() as conn:
            try:
                result = await first(conn)
            finally:
                inside.set()
            await go.wait()
        return result

    async def run_second() -> B:
        await inside.wait()
        async with db.write() as conn:
            return await second(conn)

    one, two = asyncio.create_task(run_first()), asyncio.create_task(run_second())
    try:
        await inside.wait()
        await waiting_on_a_lock(db)
    finally:
        go.set()
    return await one, await two
