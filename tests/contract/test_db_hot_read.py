"""`Database.hot_read` on both stores: the same rows as SQLAlchemy's own path, every commit seen at once, no lock or
transaction left behind, and a lost connection replaced."""
from __future__ import annotations

import asyncio
import sqlite3
from typing import AsyncIterator

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.util.concurrency import greenlet_spawn

from hub.clock import ManualClock
from hub.store.db import Database, HotRead
from hub.store.tables import boxes, lease_tasks, principals, profiles
from tests.contract.task_rows import T0, principal

# SQLAlchemy closes the reconnect it could not await outside its greenlet (hub/store/db.py filters this outside pytest)
REOPENS = pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
_NAMES = HotRead(sa.select(principals.c.name).where(principals.c.kind == "user").order_by(principals.c.name))
_PROFILE = HotRead(sa.select(profiles).where(profiles.c.name == sa.bindparam("name")))
_TASK_AND_BOXES = HotRead(
    sa.select(lease_tasks, boxes.c.id.label("box_id"), boxes.c.handle.label("box_handle"),
              boxes.c.created_at.label("box_created_at"))
    .select_from(lease_tasks.outerjoin(boxes, boxes.c.task_id == lease_tasks.c.id))
    .where(lease_tasks.c.id == sa.bindparam("task_id")).order_by(boxes.c.id))


async def add_user(db: Database, name: str, clock: ManualClock) -> None:
    async with db.write() as conn:
        await conn.execute(principals.insert().values(id=f"pr_{name}", kind="user", name=name,
                                                      created_at=clock.now()))


async def test_a_hot_read_returns_the_rows_and_values_sqlalchemy_returns(db: Database):
    async with db.write() as conn:
        owner = await principal(conn)
        await conn.execute(profiles.insert().values(name="p", engine="claude", digest="sha256:p", created_by=owner,
                                                    manifest={"name": "p", "nested": {"n": [1, 2]}}, created_at=T0,
                                                    updated_at=T0))
        await conn.execute(lease_tasks.insert().values(
            id="task_1", owner_id=owner, name="t", status="open", holder_label="mcp:Claude", holder_token_id=None,
            secret_hash="s" * 64, attached_at=T0, last_activity_at=T0, created_at=T0))
        for bid in ("vm_a", "vm_b"):
            await conn.execute(boxes.insert().values(id=bid, task_id="task_1", driver="local", state="live",
                                                     handle={"sandbox": "bwrap"}, created_at=T0))
    for read, params in ((_PROFILE, {"name": "p"}), (_TASK_AND_BOXES, {"task_id": "task_1"}),
                         (_TASK_AND_BOXES, {"task_id": "task_none"})):
        async with db.autocommit() as conn:
            expected = (await conn.execute(read.stmt, params)).all()
        got = await db.hot_read(read, params)
        assert [tuple(r) for r in got] == [tuple(r) for r in expected]
        assert [[type(v) for v in r] for r in got] == [[type(v) for v in r] for r in expected]
        assert all(r._fields == tuple(read.keys) for r in got)
    (row,) = await db.hot_read(_PROFILE, {"name": "p"})
    assert row.manifest == {"name": "p", "nested": {"n": [1, 2]}} and row.created_at.replace(tzinfo=None) == \
        T0.replace(tzinfo=None)


async def test_a_hot_read_sees_a_commit_made_on_another_connection_at_once(db: Database, clock: ManualClock):
    await add_user(db, "ann", clock)
    assert [r.name for r in await db.hot_read(_NAMES)] == ["ann"]
    async with db.read() as reader:  # another connection's open snapshot does not hold the hot read back
        await reader.execute(sa.select(principals.c.id))
        await add_user(db, "bob", clock)
        assert [r.name for r in await db.hot_read(_NAMES)] == ["ann", "bob"]
    for _ in range(3):  # whichever pooled connection serves it
        await add_user(db, f"u{_}", clock)
        assert len(await db.hot_read(_NAMES)) == 3 + _


async def test_a_hot_read_leaves_no_transaction_or_lock_behind(db: Database, clock: ManualClock):
    await add_user(db, "ann", clock)
    pool = db.engine.sync_engine.pool
    for _ in range(5):
        await db.hot_read(_NAMES)
    assert pool.checkedout() == 0
    async with db.write() as conn:  # a writer does not wait for a lock the reads kept
        await conn.execute(principals.update().where(principals.c.id == "pr_ann").values(name="ann2"))
    assert [r.name for r in await db.hot_read(_NAMES)] == ["ann2"]


@REOPENS
async def test_a_cancelled_hot_read_gives_its_connection_back(db: Database, clock: ManualClock):
    await add_user(db, "ann", clock)
    pool = db.engine.sync_engine.pool
    for _ in range(5):
        task = asyncio.ensure_future(db.hot_read(_NAMES))
        await asyncio.sleep(0)
        task.cancel()
        try:  # a SQLite hot read ran on the loop's thread without awaiting: it finished before the cancel
            assert [r.name for r in await task] == ["ann"] and db.is_sqlite
        except asyncio.CancelledError:
            pass
    assert pool.checkedout() == 0
    assert [r.name for r in await db.hot_read(_NAMES)] == ["ann"]
    async with db.write() as conn:
        await conn.execute(principals.update().where(principals.c.id == "pr_ann").values(name="ann2"))
    assert [r.name for r in await db.hot_read(_NAMES)] == ["ann2"]


async def test_a_sqlite_hot_read_runs_on_the_loops_thread_with_no_pooled_connection_and_never_waits_for_a_writer(
        sqlite_url: str, clock: ManualClock):
    db = Database(sqlite_url)
    try:
        await add_user(db, "ann", clock)
        await db.hot_read(_NAMES)
        pool = db.engine.sync_engine.pool
        taken = [0]

        def checkout(*_: object) -> None:
            taken[0] += 1

        sa.event.listen(db.engine.sync_engine.pool, "checkout", checkout)
        async with db.write() as conn:  # a writer holds SQLite's write lock with a change not committed yet
            await conn.execute(principals.update().where(principals.c.id == "pr_ann").values(name="ann2"))
            assert [r.name for r in await db.hot_read(_NAMES)] == ["ann"]  # the last commit, at once
        assert [r.name for r in await db.hot_read(_NAMES)] == ["ann2"]
        assert taken[0] == 1 and pool.checkedout() == 0  # the writer's connection only
    finally:
        await db.close()


async def test_a_sqlite_hot_read_that_sqlite_answers_busy_runs_again_through_the_pool(sqlite_url: str,
                                                                                       clock: ManualClock):
    db = Database(sqlite_url)

    class Busy:  # what the loop's connection meets when SQLite cannot give it a read at once
        def execute(self, *_: object) -> None:
            raise sqlite3.OperationalError("database is locked")

        def close(self) -> None:
            pass

    try:
        await add_user(db, "ann", clock)
        db._inline = Busy()  # type: ignore[assignment]
        assert [r.name for r in await db.hot_read(_NAMES)] == ["ann"]
        assert db.engine.sync_engine.pool.checkedout() == 0
    finally:
        await db.close()


@pytest.fixture
async def pg_db(pg_url: str) -> AsyncIterator[Database]:
    """A PostgreSQL database (an embedded SQLite connection is not lost to a server restart)."""
    database = Database(pg_url)
    yield database
    await database.close()


async def test_a_hot_read_on_a_lost_connection_is_run_again_on_a_new_one(pg_db: Database, clock: ManualClock):
    db = pg_db
    await add_user(db, "ann", clock)
    await db.hot_read(_NAMES)  # one connection now waits in the pool
    pool = db.engine.sync_engine.pool
    assert pool.checkedin() == 1
    fairy = await greenlet_spawn(pool.connect)
    pid = await fairy.dbapi_connection.driver_connection.fetchval("SELECT pg_backend_pid()")  # type: ignore[union-attr]
    fairy.close()
    other = await asyncpg.connect(db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        await other.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await other.close()
    assert [r.name for r in await db.hot_read(_NAMES)] == ["ann"]
    assert pool.checkedout() == 0


@REOPENS
async def test_a_hot_read_reopens_an_idle_connection_the_pool_closed(db: Database, clock: ManualClock):
    await add_user(db, "ann", clock)
    await db.hot_read(_NAMES)
    pool = db.engine.sync_engine.pool
    fairy = await greenlet_spawn(pool.connect)
    await greenlet_spawn(fairy.invalidate)  # closed: the pool reopens it on its next checkout (an await)
    fairy.close()
    assert pool.checkedin() >= 1
    assert [r.name for r in await db.hot_read(_NAMES)] == ["ann"]
    assert pool.checkedout() == 0
