"""`Database.autocommit` on both stores: each statement stands alone, with no transaction around it."""
from __future__ import annotations

from typing import Any

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


async def transactions_of_two_statements(db: Database, conn: Connection, begun: list[str]) -> int:
    """Run two statements on `conn`; return how many transactions they ran in (1 or 2)."""
    if db.is_sqlite:  # SQLite runs a statement outside BEGIN … in a transaction of its own
        begun.clear()
        await conn.execute(sa.text("SELECT 1"))
        await conn.execute(sa.text("SELECT 2"))
        return 1 if begun else 2
    # PostgreSQL's now() is the start of the statement's transaction
    first = (await conn.execute(sa.text("SELECT now()"))).scalar_one()
    await conn.execute(sa.text("SELECT pg_sleep(0.001)"))
    return 1 if (await conn.execute(sa.text("SELECT now()"))).scalar_one() == first else 2


async def test_each_statement_on_an_autocommit_connection_is_its_own_transaction(db: Database):
    begun: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("BEGIN"):
            begun.append(statement)

    sa.event.listen(db.engine.sync_engine, "before_cursor_execute", record)
    try:
        async with db.autocommit() as conn:
            assert await transactions_of_two_statements(db, conn, begun) == 2
        async with db.read() as conn:  # a read is still one transaction: the pool gave back a plain connection
            assert await transactions_of_two_statements(db, conn, begun) == 1
    finally:
        sa.event.remove(db.engine.sync_engine, "before_cursor_execute", record)
