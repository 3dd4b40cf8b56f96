"""`execute_many` and statements inside `Database.write`/`transaction` (hub/store/db.py) on both stores: a batch
writes every parameter set or, with the transaction, none; a broken constraint raises SQLAlchemy's error and keeps
nothing; a lost PostgreSQL connection is invalidated and its failure transient (`Database.transaction` runs it
again)."""
from __future__ import annotations

from typing import AsyncIterator

import pytest
import sqlalchemy as sa

from hub.store.db import Database, execute_many, is_transient, one_of
from hub.store.tables import api_tokens, principals, runtimes
from tests.contract.task_rows import T0

_RENAME = (principals.update().where(one_of(principals.c.id, "ids"))
           .values(name=principals.c.name + sa.bindparam("suffix"))
           .returning(principals.c.id, principals.c.name))
_TOUCH = principals.update().where(principals.c.id == sa.bindparam("b_id")).values(kind="agent")
_ADD = principals.insert().values(id=sa.bindparam("b_id"), kind="user", name=sa.bindparam("b_name"),
                                  created_at=sa.bindparam("b_at"))


async def add(db: Database, *names: str) -> None:
    async with db.write() as conn:
        await conn.execute(principals.insert(), [{"id": f"pr_{n}", "kind": "user", "name": n, "created_at": T0}
                                                 for n in names])


async def names(db: Database) -> list[str]:
    async with db.read() as conn:
        return list((await conn.execute(sa.select(principals.c.name).order_by(principals.c.id))).scalars())


async def test_a_statement_that_breaks_a_constraint_raises_sqlalchemys_integrity_error_and_keeps_nothing(
        db: Database):
    await add(db, "ann")
    with pytest.raises(sa.exc.IntegrityError):
        async with db.write() as conn:
            await conn.execute(_ADD, {"b_id": "pr_new", "b_name": "new", "b_at": T0})
            await conn.execute(_ADD, {"b_id": "pr_ann", "b_name": "again", "b_at": T0})
    assert await names(db) == ["ann"]
    async with db.write() as conn:  # the connection went back to the pool usable
        await conn.execute(_ADD, {"b_id": "pr_new", "b_name": "new", "b_at": T0})
    assert await names(db) == ["ann", "new"]


async def test_a_batch_writes_every_parameter_set_and_a_broken_one_keeps_none(db: Database):
    await add(db, "ann", "bob")
    async with db.write() as conn:
        await execute_many(conn, _TOUCH, [{"b_id": "pr_ann"}, {"b_id": "pr_bob"}, {"b_id": "pr_none"}])
        await execute_many(conn, _ADD, [])  # nothing to run
    async with db.read() as conn:
        kinds = (await conn.execute(sa.select(principals.c.kind).order_by(principals.c.id))).scalars().all()
    assert kinds == ["agent", "agent"]
    with pytest.raises(sa.exc.IntegrityError):
        async with db.write() as conn:
            await execute_many(conn, _ADD, [{"b_id": "pr_cy", "b_name": "cy", "b_at": T0},
                                        {"b_id": "pr_ann", "b_name": "again", "b_at": T0}])
    assert await names(db) == ["ann", "bob"]  # the first set went with the transaction


async def test_a_batch_insert_writes_the_rows_and_leaves_server_defaults_to_the_database(
        db: Database):
    rows = [{"id": f"pr_{n}", "kind": "user", "name": n, "created_at": T0} for n in ("ann", "bob")]
    mixed = [{"id": "pr_cy", "kind": "service", "name": "cy", "created_at": T0},
             {"id": "pr_dee", "name": "dee", "kind": "agent", "created_at": T0}]  # the same columns, another order
    tokens = [{"id": f"tok_{i}", "principal_id": "pr_ann", "token_hash": f"h{i}", "admin": i == 1, "created_at": T0}
              for i in (1, 2)]  # no kind: the column's server default ("user")
    async with db.write() as conn:
        await execute_many(conn, principals.insert(), rows)
        await execute_many(conn, principals.insert(), mixed)
        await execute_many(conn, principals.insert(), [])
        await execute_many(conn, api_tokens.insert(), tokens)
        await execute_many(conn, runtimes.insert(), [
            {"id": "rt_1", "name": "rt", "principal_id": "pr_ann", "shared": False,
             "capabilities": {"engines": ["scripted"], "n": [1, "x"]}, "slots": 2, "status": "online",
             "registered_at": T0, "last_seen_at": T0}])
    async with db.read() as conn:
        got = (await conn.execute(sa.select(principals.c.id, principals.c.kind, principals.c.created_at)
                                  .order_by(principals.c.id))).all()
        kinds = (await conn.execute(sa.select(api_tokens.c.id, api_tokens.c.kind, api_tokens.c.admin)
                                    .order_by(api_tokens.c.id))).all()
        caps = (await conn.execute(sa.select(runtimes.c.capabilities))).scalar_one()
    assert [(r.id, r.kind) for r in got] == [("pr_ann", "user"), ("pr_bob", "user"), ("pr_cy", "service"),
                                            ("pr_dee", "agent")]
    assert {r.created_at.replace(tzinfo=None) for r in got} == {T0.replace(tzinfo=None)}
    assert [tuple(r) for r in kinds] == [("tok_1", "user", True), ("tok_2", "user", False)]
    assert caps == {"engines": ["scripted"], "n": [1, "x"]}  # JSON bound and read back as SQLAlchemy's JSON type


@pytest.fixture
async def pg_db(pg_url: str) -> AsyncIterator[Database]:
    """A PostgreSQL database (an embedded SQLite connection is not lost to a server restart)."""
    database = Database(pg_url)
    yield database
    await database.close()


async def test_a_statement_on_a_lost_connection_fails_transient_and_the_transaction_runs_again(pg_db: Database):
    db = pg_db
    await add(db, "ann")
    attempts = []

    async def rename(conn):
        attempts.append(1)
        if len(attempts) == 1:  # the server ends this connection before the statement
            pid = (await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar()
            async with db.read() as other:
                await other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        return (await conn.execute(_RENAME, {"ids": ["pr_ann"], "suffix": "+"})).all()

    res = await db.transaction(rename)
    assert len(attempts) == 2 and [tuple(r) for r in res] == [("pr_ann", "ann+")]
    assert await names(db) == ["ann+"]


async def test_a_lost_connections_error_is_transient_and_invalidates_the_connection(pg_db: Database):
    db = pg_db
    with pytest.raises(sa.exc.DBAPIError) as caught:
        async with db.write() as conn:
            pid = (await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar()
            async with db.read() as other:
                await other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            await conn.execute(_TOUCH, {"b_id": "pr_x"})
    assert is_transient(caught.value) and caught.value.connection_invalidated
    async with db.write() as conn:  # the pool gave a new connection
        assert (await conn.execute(_TOUCH, {"b_id": "pr_x"})).rowcount == 0
