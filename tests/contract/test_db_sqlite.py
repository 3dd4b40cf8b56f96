"""SQLite's transaction rules on the stock aiosqlite dialect (hub/store/db.py): a writer takes the write lock up
front and a cancelled one frees it at once, a read is one snapshot that takes no write lock, executemany and
rowcounts are SQLAlchemy's, and WAL checkpoints run in the background only."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import AsyncIterator

import pytest
import sqlalchemy as sa

from hub.clock import ManualClock
from hub.store.db import Database
from hub.store.tables import principals


@pytest.fixture
async def sdb(sqlite_url: str) -> AsyncIterator[Database]:
    database = Database(sqlite_url)
    yield database
    await database.close()


def new_principal(key: str, clock: ManualClock) -> sa.Insert:
    return principals.insert().values(id=f"p_{key}", kind="user", name=key, created_at=clock.now())


async def names(db: Database) -> set[str]:
    async with db.read() as conn:
        return set((await conn.execute(sa.select(principals.c.name))).scalars())


async def test_a_writer_cancelled_while_its_statement_runs_rolls_back_and_frees_the_write_lock(
        sdb: Database, clock: ManualClock):
    entered, release = threading.Event(), threading.Event()

    def gate() -> str:  # runs in the connection's thread, inside the INSERT
        entered.set()
        release.wait(30)
        return "stuck"

    async def writer() -> None:
        async with sdb.write() as conn:
            await conn.run_sync(lambda c: c.connection.dbapi_connection.create_function("gate", 0, gate))
            await conn.execute(principals.insert().values(id="p_stuck", kind="user", name=sa.func.gate(),
                                                          created_at=clock.now()))

    task = asyncio.create_task(writer())
    await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
    task.cancel()
    release.set()  # the INSERT completes in its thread after its caller was cancelled
    with pytest.raises(asyncio.CancelledError):
        await task
    async with sdb.write() as conn:  # BEGIN IMMEDIATE would fail after busy_timeout if the lock were still held
        await conn.execute(new_principal("next", clock))
    assert {"next"} <= await names(sdb) and "stuck" not in await names(sdb)


async def test_a_read_on_a_connection_a_writer_used_takes_no_write_lock_and_each_statement_sees_later_commits(
        sdb: Database, clock: ManualClock):
    async with sdb.write() as conn:
        await conn.execute(new_principal("first", clock))
    async with sdb.read() as conn:  # the pool's one idle connection: the writer's, without its BEGIN IMMEDIATE
        count = sa.select(sa.func.count()).select_from(principals)
        before = (await conn.execute(count)).scalar_one()
        async with sdb.write() as other:  # would fail after busy_timeout if the read had begun IMMEDIATE
            await other.execute(new_principal("second", clock))
        assert (await conn.execute(count)).scalar_one() == before + 1


async def test_rowcount_lastrowid_and_executemany_are_sqlalchemys(sdb: Database, clock: ManualClock):
    async with sdb.write() as conn:
        inserted = await conn.execute(new_principal("a", clock))
        rowid = (await conn.execute(sa.text("SELECT rowid FROM principals WHERE id = 'p_a'"))).scalar_one()
        assert inserted.lastrowid == rowid
        many = await conn.execute(principals.insert(), [{"id": f"p_m{i}", "kind": "user", "name": f"m{i}",
                                                         "created_at": clock.now()} for i in range(5)])
        assert many.rowcount == 5
        updated = await conn.execute(principals.update().where(principals.c.name.like("m%")).values(kind="bot"))
        assert updated.rowcount == 5
        returned = await conn.execute(principals.delete().where(principals.c.kind == "bot")
                                      .returning(principals.c.name))
        assert sorted(returned.scalars()) == [f"m{i}" for i in range(5)]
    assert await names(sdb) == {"a"}


async def test_no_commit_checkpoints_the_wal_and_the_background_checkpoint_copies_it_into_the_database(
        sdb: Database, clock: ManualClock):
    path = Path(sa.make_url(sdb.url).database or "")
    async with sdb.read() as conn:
        assert (await conn.exec_driver_sql("PRAGMA wal_autocheckpoint")).scalar() == 0
        page = (await conn.exec_driver_sql("PRAGMA page_size")).scalar()
    before = path.stat().st_size
    for i in range(60):  # ~2,000 pages of WAL: twice what SQLite's default would checkpoint inside a commit
        async with sdb.write() as conn:
            await conn.execute(principals.insert(), [
                {"id": f"p_{i}_{j}", "kind": "user", "name": f"{i}-{j}-" + "x" * 3000, "created_at": clock.now()}
                for j in range(40)])
    wal = path.with_name(path.name + "-wal")
    assert wal.stat().st_size > 1500 * page and path.stat().st_size == before  # all of it still in the WAL

    await sdb.checkpoint()

    assert path.stat().st_size > 1500 * page  # copied into the database file
    assert len(await names(sdb)) >= 60 * 40
