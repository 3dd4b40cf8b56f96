"""Alembic environment: async engine, URL passed in by hub.store.db.alembic_config."""
from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import create_async_engine

config = context.config


MIGRATION_LOCK = 0x616D7578  # "amux": replicas starting together take turns; the later ones find the schema at head


def _run(connection) -> None:  # noqa: ANN001
    context.configure(connection=connection, target_metadata=None, render_as_batch=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        context.run_migrations()


async def _main(url: str) -> None:
    engine = create_async_engine(url, poolclass=pool.NullPool)
    async with engine.connect() as conn:
        await conn.run_sync(_run)
        await conn.commit()
    await engine.dispose()


url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
if context.is_offline_mode():
    context.configure(url=url, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_main(url))
