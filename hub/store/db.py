"""Engine factory, transactions and schema upgrades; SQLite/PostgreSQL differences live here."""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import AsyncIterator

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ..errors import Invalid

MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"


def normalize_url(url: str) -> str:
    """Map plain `postgresql://` and `sqlite://` URLs onto the async drivers."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    if url.startswith("sqlite:///"):
        return "sqlite+aiosqlite:///" + url.split(":///", 1)[1]
    return url


class Database:
    """One engine plus the rules for write transactions on its dialect."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = normalize_url(url)
        parsed = make_url(self.url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if parsed.get_backend_name() not in ("sqlite", "postgresql"):
            raise Invalid(f"unsupported database {parsed.get_backend_name()!r}; use sqlite+aiosqlite:/// or postgresql+asyncpg://")
        if self.is_sqlite:
            if parsed.database:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            self.engine: AsyncEngine = create_async_engine(
                self.url, echo=echo, pool_size=4, max_overflow=4, connect_args={"timeout": 30}
            )
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
        else:
            self.engine = create_async_engine(self.url, echo=echo, pool_size=10, max_overflow=20)
        # SQLite is the single-process embedded store: serialize writers in-process so that
        # read-check-write sequences (capacity, leases) cannot interleave. PostgreSQL uses row locks.
        self._write_lock = asyncio.Lock() if self.is_sqlite else None

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """Open a write transaction; commits on success, rolls back on error."""
        if self._write_lock is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._write_lock:
            async with self.engine.begin() as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """Open a read-only connection."""
        async with self.engine.connect() as conn:
            yield conn

    def for_update(self, stmt: sa.Select, *, skip_locked: bool = False) -> sa.Select:
        """Add row locks on PostgreSQL (SQLite relies on the in-process writer lock)."""
        if self.is_sqlite:
            return stmt
        return stmt.with_for_update(skip_locked=skip_locked)

    async def close(self) -> None:
        """Dispose of the pool."""
        await self.engine.dispose()


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def alembic_config(url: str):  # noqa: ANN201
    """Return an Alembic config pointing at our migrations and `url`."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = normalize_url(url)
    return cfg


def upgrade_sync(url: str, revision: str = "heads") -> None:
    """Apply migrations up to `revision` (blocking; call from a thread inside a loop)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


async def upgrade(url: str, revision: str = "heads") -> None:
    """Apply migrations without blocking the running event loop."""
    await asyncio.to_thread(upgrade_sync, url, revision)
