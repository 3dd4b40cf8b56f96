"""Alembic migrations are the only source of the schema; the query tables must match them."""
from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from hub.store.tables import metadata


async def test_migrated_schema_matches_the_table_definitions(db):
    def diff(sync_conn):
        ctx = MigrationContext.configure(sync_conn, opts={"compare_type": False})
        return [d for d in compare_metadata(ctx, metadata)
                if not (isinstance(d, tuple) and d[0] == "remove_table" and d[1].name == "alembic_version")]

    async with db.read() as conn:
        differences = await conn.run_sync(diff)
    assert differences == []
