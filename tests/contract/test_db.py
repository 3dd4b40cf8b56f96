"""The transaction rules of hub/store/db.py on both stores."""
from __future__ import annotations

import asyncio
import time

import pytest
import sqlalchemy as sa

from hub.store.db import is_transient
from hub.store.tables import principals


async def test_a_cancelled_writer_ends_its_transaction_at_once_so_the_next_writer_does_not_wait(db):
    started = asyncio.Event()

    async def stuck_writer() -> None:
        async with db.write() as conn:
            await conn.execute(principals.insert().values(id="p_stuck", kind="user", name="stuck",
                                                          created_at=sa.func.now()))
            started.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(stuck_writer())
    await started.wait()
    task.cancel()
    t0 = time.perf_counter()
    async with db.write() as conn:
        await conn.execute(principals.insert().values(id="p_next", kind="user", name="next", created_at=sa.func.now()))
    assert time.perf_counter() - t0 < 2.0  # SQLite's busy_timeout is 5 s: nobody waited for the collector
    async with db.read() as conn:
        names = set((await conn.execute(sa.select(principals.c.name))).scalars())
    assert "next" in names and "stuck" not in names  # the cancelled transaction was rolled back


async def test_a_transaction_is_run_again_only_for_transient_errors(db):
    calls = []

    async def body(conn) -> int:
        calls.append(1)
        await conn.execute(principals.insert().values(id=f"p_{len(calls)}", kind="user", name=f"n{len(calls)}",
                                                      created_at=sa.func.now()))
        return len(calls)

    assert await db.transaction(body) == 1
    assert not is_transient(ValueError("not a database error"))
    assert is_transient(sa.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection")))


async def test_a_statement_error_mid_transaction_rolls_back_what_the_transaction_wrote(db):
    async def body(conn) -> None:
        await conn.execute(principals.insert().values(id="p_one", kind="user", name="one", created_at=sa.func.now()))
        await conn.execute(principals.insert().values(id="p_two", kind="user", name="one", created_at=sa.func.now()))

    with pytest.raises(sa.exc.IntegrityError):  # the second row repeats the unique name
        await db.transaction(body)
    async with db.write() as conn:  # the failed writer left no transaction (nor, on SQLite, its write lock) behind
        await conn.execute(principals.insert().values(id="p_three", kind="user", name="three",
                                                      created_at=sa.func.now()))
    async with db.read() as conn:
        names = set((await conn.execute(sa.select(principals.c.name))).scalars())
    assert "three" in names and "one" not in names


async def test_executemany_writes_every_row_and_an_update_counts_its_rows(db):
    rows = [{"id": f"p_m{i}", "kind": "user", "name": f"many {i}"} for i in range(7)]
    async with db.write() as conn:
        await conn.execute(principals.insert().values(created_at=sa.func.now()), rows)
        updated = await conn.execute(principals.update().where(principals.c.name.like("many %")).values(kind="bot"))
        assert updated.rowcount == 7
    async with db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).where(principals.c.kind == "bot"))).scalar_one() == 7
