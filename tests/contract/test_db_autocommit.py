"""`Database.autocommit` on both stores: each statement stands alone, with no transaction around it."""
from __future__ import annotations

import uuid

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
