"""`Database.read` on both stores: each statement stands alone, and it gives its connection back."""
from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from hub.clock import ManualClock
from hub.store.db import Connection, Database
from hub.store.sqlite import READERS
from hub.store.tables import principals


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


async def test_each_statement_of_a_read_is_its_own_transaction(db: Database, clock: ManualClock):
    async with db.read() as conn:
        assert await transactions_of_two_statements(db, conn, clock) == 2


async def test_a_read_gives_its_connection_back_when_its_body_fails_and_the_next_read_sees_later_commits(
        db: Database, clock: ManualClock):
    pool = db.sync_engine.pool
    before = pool.checkedout()
    with pytest.raises(RuntimeError, match="boom"):
        async with db.read() as conn:
            await conn.execute(sa.text("SELECT 1"))
            raise RuntimeError("boom")
    if db.is_sqlite:  # each reader thread keeps its own connection; a read holds none between its statements
        assert pool.checkedout() <= READERS
    else:
        assert pool.checkedout() == before
    async with db.write() as conn:
        await conn.execute(principals.insert().values(id="pr_later", kind="user", name="later", created_at=clock.now()))
    async with db.read() as conn:
        assert (await conn.execute(sa.select(principals.c.name).where(principals.c.id == "pr_later"))).scalar() \
            == "later"
