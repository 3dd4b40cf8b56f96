"""`run`, `run_many` and `insert_many` (hub/store/db.py) on both stores: a hot statement inside the caller's
transaction returns what SQLAlchemy's own path returns (and writes what it writes), is undone by the transaction's
rollback (even as its first statement), and fails with SQLAlchemy's errors (a lost PostgreSQL connection invalidated,
the failure transient: `Database.transaction` runs it again)."""
from __future__ import annotations

from typing import AsyncIterator

import pytest
import sqlalchemy as sa

from hub.store.db import Database, HotRead, insert_many, is_transient, one_of, run, run_many
from hub.store.tables import api_tokens, principals, runtimes
from tests.contract.task_rows import T0

_RENAME = HotRead(principals.update().where(one_of(principals.c.id, "ids"))
                  .values(name=principals.c.name + sa.bindparam("suffix"))
                  .returning(principals.c.id, principals.c.name))
_TOUCH = HotRead(principals.update().where(principals.c.id == sa.bindparam("b_id")).values(kind="agent"))
_NAMES = HotRead(sa.select(principals.c.id, principals.c.name, principals.c.created_at)
                 .where(principals.c.kind == sa.bindparam("kind")).order_by(principals.c.id))
_ADD = HotRead(principals.insert().values(id=sa.bindparam("b_id"), kind="user", name=sa.bindparam("b_name"),
                                          created_at=sa.bindparam("b_at")))


async def add(db: Database, *names: str) -> None:
    async with db.write() as conn:
        await conn.execute(principals.insert(), [{"id": f"pr_{n}", "kind": "user", "name": n, "created_at": T0}
                                                 for n in names])


async def names(db: Database) -> list[str]:
    async with db.read() as conn:
        return list((await conn.execute(sa.select(principals.c.name).order_by(principals.c.id))).scalars())


async def test_a_hot_statement_returns_the_rows_and_count_sqlalchemy_returns(db: Database):
    await add(db, "ann", "bob", "cy")
    async with db.write() as conn:
        res = await run(conn, _RENAME, {"ids": ["pr_ann", "pr_cy", "pr_none"], "suffix": "!"})
        assert sorted(tuple(r) for r in res.rows) == [("pr_ann", "ann!"), ("pr_cy", "cy!")] and res.rowcount == 2
        assert (await run(conn, _TOUCH, {"b_id": "pr_bob"})).rowcount == 1
        assert (await run(conn, _TOUCH, {"b_id": "pr_none"})) == ([], 0)
        got = await run(conn, _NAMES, {"kind": "user"})
        expected = (await conn.execute(_NAMES.stmt, {"kind": "user"})).all()
    assert [tuple(r) for r in got.rows] == [tuple(r) for r in expected] and got.rowcount == 2
    assert [type(v) for v in got.rows[0]] == [type(v) for v in expected[0]]  # created_at a datetime on both
    assert got.rows[0].name == "ann!" and got.rows[0]._asdict()["id"] == "pr_ann"
    assert await names(db) == ["ann!", "bob", "cy!"]


async def test_a_hot_statement_is_undone_by_its_transactions_rollback_even_as_its_first_statement(db: Database):
    await add(db, "ann")

    class Undo(Exception):
        pass

    with pytest.raises(Undo):
        async with db.write() as conn:
            await run(conn, _RENAME, {"ids": ["pr_ann"], "suffix": "?"})  # the transaction's first statement
            await conn.execute(principals.update().values(kind="agent"))
            raise Undo
    assert await names(db) == ["ann"]
    async with db.write() as conn:
        await conn.execute(principals.update().values(kind="service"))
        await run(conn, _RENAME, {"ids": ["pr_ann"], "suffix": "."})
    assert await names(db) == ["ann."]


async def test_a_hot_statement_that_breaks_a_constraint_raises_sqlalchemys_integrity_error_and_keeps_nothing(
        db: Database):
    await add(db, "ann")
    with pytest.raises(sa.exc.IntegrityError):
        async with db.write() as conn:
            await run(conn, _ADD, {"b_id": "pr_new", "b_name": "new", "b_at": T0})
            await run(conn, _ADD, {"b_id": "pr_ann", "b_name": "again", "b_at": T0})
    assert await names(db) == ["ann"]
    async with db.write() as conn:  # the connection went back to the pool usable
        await run(conn, _ADD, {"b_id": "pr_new", "b_name": "new", "b_at": T0})
    assert await names(db) == ["ann", "new"]


async def test_a_hot_statement_run_many_times_writes_every_parameter_set_and_a_broken_one_keeps_none(db: Database):
    await add(db, "ann", "bob")
    async with db.write() as conn:
        await run_many(conn, _TOUCH, [{"b_id": "pr_ann"}, {"b_id": "pr_bob"}, {"b_id": "pr_none"}])
        await run_many(conn, _ADD, [])  # nothing to run
    async with db.read() as conn:
        kinds = (await conn.execute(sa.select(principals.c.kind).order_by(principals.c.id))).scalars().all()
    assert kinds == ["agent", "agent"]
    with pytest.raises(sa.exc.IntegrityError):
        async with db.write() as conn:
            await run_many(conn, _ADD, [{"b_id": "pr_cy", "b_name": "cy", "b_at": T0},
                                        {"b_id": "pr_ann", "b_name": "again", "b_at": T0}])
    assert await names(db) == ["ann", "bob"]  # the first set went with the transaction


async def test_insert_many_writes_the_rows_as_sqlalchemys_insert_does_and_leaves_server_defaults_to_the_database(
        db: Database):
    rows = [{"id": f"pr_{n}", "kind": "user", "name": n, "created_at": T0} for n in ("ann", "bob")]
    mixed = [{"id": "pr_cy", "kind": "service", "name": "cy", "created_at": T0},
             {"id": "pr_dee", "name": "dee", "kind": "agent", "created_at": T0}]  # the same columns, another order
    tokens = [{"id": f"tok_{i}", "principal_id": "pr_ann", "token_hash": f"h{i}", "admin": i == 1, "created_at": T0}
              for i in (1, 2)]  # no kind: the column's server default ("user")
    async with db.write() as conn:
        await insert_many(conn, principals, rows)
        await insert_many(conn, principals, mixed)
        await insert_many(conn, principals, [])
        await insert_many(conn, api_tokens, tokens)
        await insert_many(conn, runtimes, [{"id": "rt_1", "name": "rt", "principal_id": "pr_ann", "shared": False,
                                            "capabilities": {"engines": ["scripted"], "n": [1, "x"]}, "slots": 2,
                                            "status": "online", "registered_at": T0, "last_seen_at": T0}])
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


async def test_a_hot_statement_on_a_lost_connection_fails_transient_and_the_transaction_runs_again(pg_db: Database):
    db = pg_db
    await add(db, "ann")
    attempts = []

    async def rename(conn):
        attempts.append(1)
        if len(attempts) == 1:  # the server ends this connection before the statement
            pid = (await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar()
            async with db.autocommit() as other:
                await other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        return await run(conn, _RENAME, {"ids": ["pr_ann"], "suffix": "+"})

    res = await db.transaction(rename)
    assert len(attempts) == 2 and [tuple(r) for r in res.rows] == [("pr_ann", "ann+")]
    assert await names(db) == ["ann+"]


async def test_a_lost_connections_error_is_transient_and_invalidates_the_connection(pg_db: Database):
    db = pg_db
    with pytest.raises(sa.exc.DBAPIError) as caught:
        async with db.write() as conn:
            pid = (await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar()
            async with db.autocommit() as other:
                await other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            await run(conn, _TOUCH, {"b_id": "pr_x"})
    assert is_transient(caught.value) and caught.value.connection_invalidated
    async with db.write() as conn:  # the pool gave a new connection
        assert (await run(conn, _TOUCH, {"b_id": "pr_x"})).rowcount == 0
