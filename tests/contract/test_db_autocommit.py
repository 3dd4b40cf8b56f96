"""`Database.autocommit` on both stores: each statement stands alone, with no transaction around it."""
from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from hub.clock import ManualClock
from hub.store.db import Connection, Database
from hub.store.tables import principals


async def test_an_autocommit_connection_sees_what_others_commit_between_its_statements(db: Database,
                                                                                       clock: ManualClock):
    count = sa.select(sa.func.count()).select_from(principals)
    async with db.autocommit() as conn:
        before = (await conn.execute(count)).scalar_one()
        async with db.write() as other:
            await other.execute(principals.insert().values(id="pr_new", kind="user", name="new",
                                                           created_at=clock.now()))
        assert (await conn.execute(count)).scalar_one() == before + 1


async def transactions_of_two_statements(db: Database, conn: Connection, clock: ManualClock) -> int:
    """Run two statements on `conn`; return how many transactions they ran in (1 or 2)."""
    if db.is_sqlite:  # a transaction reads one snapshot: another's commit between its statements does not show
        count = sa.select(sa.func.count()).select_from(principals)
        first = (await conn.execute(count)).scalar_one()
        async with db.write() as other:
            key = uuid.uuid4().hex
            await other.execute(principals.insert().values(id=f"pr_{key}", kind="user", name=key,
                                                           created_at=clock.now()))
        return 1 if (await conn.execute(count)).scalar_one() == first else 2
    # PostgreSQL's now() is the start of the statement's transaction
    first = (await conn.execute(sa.text("SELECT now()"))).scalar_one()
    await conn.execute(sa.text("SELECT pg_sleep(0.001)"))
    return 1 if (await conn.execute(sa.text("SELECT now()"))).scalar_one() == first else 2


async def test_each_statement_on_an_autocommit_connection_is_its_own_transaction(db: Database, clock: ManualClock):
    async with db.autocommit() as conn:
        assert await transactions_of_two_statements(db, conn, clock) == 2
    async with db.read() as conn:  # a read is still one transaction: the pool gave back a plain connection
        assert await transactions_of_two_statements(db, conn, clock) == 1


async def test_a_lazy_read_takes_no_connection_until_its_first_statement_and_then_reads_as_read_does(db: Database):
    pool = db.engine.sync_engine.pool
    before = pool.checkedout()
    async with db.lazy_read() as conn:
        assert pool.checkedout() == before  # nothing taken yet
        assert (await conn.execute(sa.text("SELECT 1"))).scalar() == 1
        assert pool.checkedout() == before + 1
        assert await conn.scalar(sa.text("SELECT 2")) == 2  # the same connection
        assert pool.checkedout() == before + 1
    assert pool.checkedout() == before


async def test_a_lazy_read_returns_its_connection_when_its_body_fails_and_refuses_what_it_cannot_defer(db: Database):
    pool = db.engine.sync_engine.pool
    before = pool.checkedout()
    with pytest.raises(RuntimeError, match="boom"):
        async with db.lazy_read() as conn:
            await conn.execute(sa.text("SELECT 1"))
            raise RuntimeError("boom")
    assert pool.checkedout() == before
    async with db.lazy_read() as conn:
        with pytest.raises(AttributeError, match="awaited methods"):
            conn.dialect  # a plain attribute would need the connection now
