"""`one_of` and `among` on both stores: the rows `IN` returns, for any list (empty, one, many, duplicated, values with
quotes and non-ASCII text), with one compiled SQL text for every length and nothing rendered per execution."""
from __future__ import annotations

import pytest
import sqlalchemy as sa

from hub.store.db import Database, among, one_of
from hub.store.tables import principals
from tests.contract.task_rows import T0

NAMES = ["ann", "bob", "o'hara", "zoë", "carol"]
_BY_NAME = sa.select(principals.c.name).where(one_of(principals.c.name, "names")).order_by(principals.c.name)


async def add(db: Database) -> None:
    async with db.write() as conn:
        await conn.execute(principals.insert(), [{"id": f"pr_{i}", "kind": "user", "name": n, "created_at": T0}
                                                 for i, n in enumerate(NAMES)])


async def test_one_of_returns_the_rows_in_returns_for_every_list(db: Database):
    await add(db)
    for names in ([], ["ann"], ["ann", "zoë"], ["o'hara", "o'hara", "nobody"], NAMES, ["nobody"]):
        async with db.read() as conn:
            got = (await conn.execute(_BY_NAME, {"names": names})).scalars().all()
            expected = (await conn.execute(sa.select(principals.c.name).where(principals.c.name.in_(names))
                                           .order_by(principals.c.name))).scalars().all()
        assert got == expected == sorted(set(names) & set(NAMES))


async def test_one_of_a_constant_list_and_a_bound_one_combine_in_one_statement(db: Database):
    await add(db)
    stmt = sa.select(principals.c.name).where(one_of(principals.c.kind, ["user", "agent"]),
                                              one_of(principals.c.name, "names"))
    async with db.read() as conn:
        assert (await conn.execute(stmt, {"names": ["bob", "zoë"]})).scalars().all() in (["bob", "zoë"], ["zoë", "bob"])
        assert (await conn.execute(stmt.where(one_of(principals.c.kind, ["agent"])), {"names": ["bob"]})).all() == []


async def test_one_of_compiles_one_sql_text_for_every_list_length(db: Database):
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    sa.event.listen(db.sync_engine, "before_cursor_execute", record)
    try:
        async with db.read() as conn:
            for names in ([], ["a"], ["a", "b", "c"], [str(i) for i in range(50)]):
                await conn.execute(_BY_NAME, {"names": names})
    finally:
        sa.event.remove(db.sync_engine, "before_cursor_execute", record)
    assert len(seen) == 4 and len(set(seen)) == 1
    assert ("= ANY(" if not db.is_sqlite else "json_each(") in seen[0]


async def test_among_writes_the_codes_constants_into_the_sql_with_quotes_escaped_and_no_parameter(db: Database):
    await add(db)
    stmt = sa.select(principals.c.name).where(among(principals.c.name, ["o'hara", "zoë", "nobody"]))
    compiled = stmt.compile(dialect=db.dialect)
    assert "'o''hara'" in str(compiled) and not compiled.params
    async with db.read() as conn:
        assert sorted((await conn.execute(stmt)).scalars().all()) == ["o'hara", "zoë"]


def test_among_refuses_an_empty_list_of_constants():
    with pytest.raises(ValueError, match="at least one"):
        among(principals.c.name, [])


def test_a_sqlite_without_json_functions_is_refused_at_start_naming_the_fix(monkeypatch, tmp_path):
    import sqlite3

    import hub.store.db as dbmod
    from hub.errors import Invalid

    class NoJson:
        sqlite_version = "3.7.0"
        Error = sqlite3.Error

        @staticmethod
        def connect(_path: str) -> sqlite3.Connection:
            class Conn:
                def execute(self, *_: object) -> None:
                    raise sqlite3.OperationalError("no such table: json_each")

                def close(self) -> None:
                    pass

            return Conn()  # type: ignore[return-value]

    monkeypatch.setattr(dbmod, "sqlite3", NoJson)
    with pytest.raises(Invalid, match="no JSON functions.*3.38 or newer"):
        Database(f"sqlite+aiosqlite:///{tmp_path / 'amux.db'}")
    assert not (tmp_path / "amux.db").exists()  # refused before anything was created
