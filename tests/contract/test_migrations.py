"""One Alembic history: exactly one head, and a downgrade to base then an upgrade round-trips on both stores."""
from __future__ import annotations

import asyncio

import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from hub.store.db import Database, alembic_config, upgrade


def test_the_migration_history_has_exactly_one_head():
    heads = ScriptDirectory.from_config(alembic_config("sqlite+aiosqlite:///unused.db")).get_heads()
    assert len(heads) == 1, heads


async def tables_and_version(url: str) -> tuple[set[str], set[str]]:
    db = Database(url)
    try:
        async with db.read() as conn:
            tables = set(await conn.run_sync(lambda c: sa.inspect(c).get_table_names()))
            version = set((await conn.execute(sa.text("select version_num from alembic_version"))).scalars())
    finally:
        await db.close()
    return tables, version


async def test_downgrade_to_base_then_upgrade_to_head_round_trips_on_each_store(db_url):
    before, version = await tables_and_version(db_url)
    cfg = alembic_config(db_url)
    await asyncio.to_thread(command.downgrade, cfg, "base")
    emptied, _ = await tables_and_version(db_url)
    assert emptied <= {"alembic_version"}, emptied
    await upgrade(db_url)
    after, again = await tables_and_version(db_url)
    assert after == before and again == version and len(version) == 1
