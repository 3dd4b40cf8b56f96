"""Engine factory, transactions and schema upgrades; SQLite/PostgreSQL differences live here."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import AsyncIterator

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ..errors import Invalid
from ..files import private_file

MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"


def normalize_url(url: str) -> str:
    """Map plain `postgresql://` and `sqlite://` URLs onto the async drivers."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    if url.startswith("sqlite:///"):
        return "sqlite+aiosqlite:///" + url.split(":///", 1)[1]
    return url


class LoopConnection:
    """The async connection interface over a synchronous SQLite connection used in the loop thread.

    Embedded SQLite answers in microseconds from the page cache; hopping to a worker thread for every
    statement (aiosqlite) costs more than the statement and, with writers serialized, caps throughput.
    """

    def __init__(self, conn: sa.Connection) -> None:
        self.sync_connection = conn

    async def execute(self, statement, parameters=None):  # noqa: ANN001, ANN201
        """Execute a statement and return its (buffered-on-demand) result."""
        return self.sync_connection.execute(statement, parameters)

    async def run_sync(self, fn, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
        """Call `fn(sync_connection, ...)`."""
        return fn(self.sync_connection, *args, **kw)


class Database:
    """One engine plus the rules for transactions on its dialect."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = normalize_url(url)
        parsed = make_url(self.url)
        backend = parsed.get_backend_name()
        if backend not in ("sqlite", "postgresql"):
            raise Invalid(f"unsupported database {backend!r}; use sqlite+aiosqlite:///PATH or postgresql+asyncpg://HOST/DB")
        self.is_sqlite = backend == "sqlite"
        self.engine: AsyncEngine | None = None
        self.sync_engine: sa.Engine | None = None
        if self.is_sqlite:
            prepare_sqlite_file(self.url)
            # hide_parameters: an error's message and log line never carry a prompt, memory value or secret.
            self.sync_engine = sa.create_engine(parsed.set(drivername="sqlite+pysqlite"), echo=echo,
                                                hide_parameters=True,
                                                pool_size=8, max_overflow=24)
            event.listen(self.sync_engine, "connect", _sqlite_connect)
            event.listen(self.sync_engine, "begin", _sqlite_begin)
        else:
            self.engine = create_async_engine(self.url, echo=echo, pool_size=10, max_overflow=20, hide_parameters=True)
        # SQLite is the single-process embedded store: writers are serialized in-process (and take the
        # database lock up front with BEGIN IMMEDIATE), so read-check-write sequences cannot interleave.
        # PostgreSQL uses row locks (`for_update`).
        self._write_lock = asyncio.Lock() if self.is_sqlite else None

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """Open a write transaction; commits on success, rolls back on error."""
        if self._write_lock is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._write_lock:
            with self.sync_engine.connect().execution_options(amux_write=True) as conn:
                with conn.begin():
                    yield LoopConnection(conn)

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """Open a connection for reads."""
        if self.sync_engine is None:
            async with self.engine.connect() as conn:
                yield conn
            return
        with self.sync_engine.connect() as conn:
            yield LoopConnection(conn)

    async def serialize(self, conn: AsyncConnection, name: str) -> None:
        """Serialize this transaction with every other one that names `name`, on every replica, until it ends.

        A PostgreSQL transaction-level advisory lock: unlike row locks on shared rows (say, every runtime),
        it cannot deadlock with the writers of those rows. SQLite's writers are serialized already.
        """
        if not self.is_sqlite:
            await conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:name))"), {"name": f"amux:{name}"})

    def for_update(self, stmt: sa.Select, *, skip_locked: bool = False) -> sa.Select:
        """Add row locks on PostgreSQL (SQLite relies on the in-process writer lock)."""
        if self.is_sqlite:
            return stmt
        return stmt.with_for_update(skip_locked=skip_locked)

    async def close(self) -> None:
        """Dispose of the pool."""
        if self.engine is not None:
            await self.engine.dispose()
        if self.sync_engine is not None:
            self.sync_engine.dispose()


def prepare_sqlite_file(url: str) -> None:
    """Create the SQLite file 0600 before SQLite does (its -wal and -shm take the database file's mode).

    An existing database, WAL or SHM is tightened to 0600: every prompt, result and memory entry is in them.
    """
    database = make_url(normalize_url(url)).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_file(path)
    for suffix in ("-wal", "-shm", "-journal"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            private_file(side)


def _sqlite_connect(dbapi_conn, _record) -> None:  # noqa: ANN001
    dbapi_conn.isolation_level = None  # SQLAlchemy's begin event issues BEGIN itself
    _sqlite_pragmas(dbapi_conn, _record)


def _sqlite_begin(conn: sa.Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("amux_write") else "BEGIN")


def _sqlite_pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=5000")
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

    if make_url(normalize_url(url)).get_backend_name() == "sqlite":
        prepare_sqlite_file(url)
    command.upgrade(alembic_config(url), revision)


async def upgrade(url: str, revision: str = "heads", attempts: int = 10) -> None:
    """Apply migrations without blocking the running event loop; retry while the database cannot be reached
    (a replica starting while PostgreSQL restarts waits for it instead of dying)."""
    for attempt in range(1, attempts + 1):
        try:
            await asyncio.to_thread(upgrade_sync, url, revision)
            return
        except (sa.exc.OperationalError, sa.exc.InterfaceError, OSError) as e:
            if attempt == attempts or normalize_url(url).startswith("sqlite"):
                raise
            wait = min(0.5 * 2 ** attempt, 8.0)
            logging.getLogger("amux.db").warning("migration could not reach the database (%s); retry %d in %.1fs",
                                                 type(e).__name__, attempt, wait)
            await asyncio.sleep(wait)
