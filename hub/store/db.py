"""Engine factory, transactions and schema upgrades; SQLite/PostgreSQL differences live here."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Collection, Coroutine, TypeVar, Unpack, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from ..errors import Invalid
from .sqlite import SqliteReader, SqliteThreads

if TYPE_CHECKING:
    from alembic.config import Config
from ..files import private_file

MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"


def normalize_url(url: str) -> str:
    """Map plain `postgresql://` and `sqlite://` URLs (and `sqlite+amux://`, the hub's former SQLite dialect) onto
    the async drivers."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    for sqlite in ("sqlite://", "sqlite+amux://", "sqlite+pysqlite://"):
        if url.startswith(sqlite):
            return "sqlite+aiosqlite://" + url[len(sqlite):]
    return url


# One connection type on both stores, as the store's code sees it: SQLAlchemy's AsyncConnection (asyncpg on
# PostgreSQL). On SQLite it is a `SqliteConnection`, which answers the same calls over the standard sqlite3 driver on
# the database's own threads (see `Database`).
Connection = AsyncConnection
Row = sa.Row[Unpack[tuple[Any, ...]]]
StoreError = sa.exc.SQLAlchemyError
"""Any error of the store itself (connection lost, a restart, a lock): what a service may tell from a refusal."""
"""A row a store method returns: attribute access by column name (store modules may return their own records)."""
T = TypeVar("T")

log = logging.getLogger("amux.db")

def is_transient(exc: BaseException) -> bool:
    """Say whether a PostgreSQL error is worth running the transaction again: connection loss, serialization
    failure, deadlock."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        return True
    code = getattr(getattr(exc, "orig", None), "sqlstate", None) or getattr(getattr(exc, "orig", None), "pgcode", None)
    return code in ("40001", "40P01")


def is_unavailable(exc: BaseException) -> bool:
    """Say whether an error means the database cannot be reached or used just now (a restart, an outage): the
    caller answers "retry", never a bare error."""
    if isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    return type(exc).__module__.startswith("asyncpg") and ("Connection" in type(exc).__name__
                                                          or "CannotConnectNow" in type(exc).__name__)


async def insert_new(conn: "Connection", table: sa.Table, values: dict[str, Any], key: Collection[str]) -> bool:
    """Insert a row unless one with the same `key` columns exists (ON CONFLICT DO NOTHING on both stores); return
    whether it was inserted. An expected race between replicas stays out of the database server's error log."""
    from sqlalchemy.dialects.postgresql import insert as pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    done = await conn.execute(insert(table).values(**values).on_conflict_do_nothing(
        index_elements=[table.c[k] for k in key]))
    return done.rowcount > 0


def unavailable_text(request_id: str | None) -> str:
    """What a caller is told while the database is unavailable: retry, with the request id."""
    rid = f" (request id {request_id})" if request_id else ""
    return f"the hub could not reach its database just now; retry in a few seconds{rid}"


class TextList(sa.types.TypeDecorator[list[str]]):
    """A list of strings bound as one parameter: a `text[]` on PostgreSQL, a JSON array on SQLite."""

    impl = sa.Text
    cache_ok = True

    def load_dialect_impl(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        return dialect.type_descriptor(ARRAY(sa.Text) if dialect.name == "postgresql" else sa.Text())

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> Any:
        values = list(value or ())
        return values if dialect.name == "postgresql" else json.dumps(values)


class _OneOf(sa.sql.functions.FunctionElement[bool]):
    """`column IN (list)` with the list in one bound parameter (see `one_of`)."""

    type = sa.Boolean()
    inherit_cache = True
    name = "one_of"
    _is_implicitly_boolean = True  # a predicate: no `= 1` after it on SQLite


@compiles(_OneOf, "postgresql")
def _one_of_postgresql(element: _OneOf, compiler: Any, **kw: Any) -> str:
    column, values = element.clauses
    return f"{compiler.process(column, **kw)} = ANY({compiler.process(values, **kw)})"


@compiles(_OneOf)
def _one_of_sqlite(element: _OneOf, compiler: Any, **kw: Any) -> str:
    column, values = element.clauses
    return f"{compiler.process(column, **kw)} IN (SELECT value FROM json_each({compiler.process(values, **kw)}))"


def one_of(column: sa.ColumnElement[Any], values: str | Collection[str]) -> sa.ColumnElement[bool]:
    """`column IN values` for text values, the list bound as ONE parameter: `column = ANY($1)` on PostgreSQL,
    `column IN (SELECT value FROM json_each(?))` on SQLite. `values` is a constant list, or the name of a
    bindparam given per execution.

    SQLAlchemy's own `in_` renders one placeholder per value at every execution (an "expanding" parameter): its SQL
    changes with the list's length, so PostgreSQL prepares it again, and rendering it was about 0.2 ms a task in
    bench/dispatch. This statement's SQL is compiled once and is the same for every list.
    """
    if isinstance(values, str):
        return _OneOf(column, sa.bindparam(values, type_=TextList()))
    return _OneOf(column, sa.literal(sorted(values), TextList()))


def among(column: sa.ColumnElement[Any], constants: Collection[str]) -> sa.ColumnElement[bool]:
    """`column IN ('a', 'b')` with the code's own constants (statuses, states) written into the SQL text, compiled
    once: no parameter to render or bind per execution (`in_` renders its list at every execution). Only for
    values the code names; a caller's values go through `one_of`."""
    if not constants:
        raise ValueError("among() needs at least one constant")
    return column.in_([sa.literal_column("'" + str(v).replace("'", "''") + "'", column.type) for v in constants])


class Database:
    """One engine plus the rules for transactions on its dialect.

    Statements run in one of three ways: `read()` (a connection whose statements each see every commit made
    before them, with no transaction around them), `write()` / `transaction(fn)` (one write transaction, committed
    on success; `transaction` runs it again on a transient PostgreSQL error), and `execute_many` (one statement,
    once per parameter set, inside either). Everything else is SQLAlchemy's own `AsyncConnection`.

    SQLite (`hub.store.sqlite`): `transaction(fn)` runs the whole body and its commit on the writer thread, one hop
    from the event loop; a body there may await only the store. `write()` and `read()` hop once per statement.
    """

    def __init__(self, url: str, *, echo: bool = False, retry_attempts: int = 3) -> None:
        self.url = normalize_url(url)
        parsed = make_url(self.url)
        backend = parsed.get_backend_name()
        if backend not in ("sqlite", "postgresql"):
            raise Invalid(f"unsupported database {backend!r}; use sqlite+aiosqlite:///PATH or postgresql+asyncpg://HOST/DB")
        self.is_sqlite = backend == "sqlite"
        self.retry_attempts = retry_attempts
        self.sqlite: SqliteThreads | None = None
        # hide_parameters: an error's message and log line never carry a prompt, memory value or secret.
        if self.is_sqlite:
            require_json_each()
            prepare_sqlite_file(self.url)
            database = parsed.database
            if not database or database == ":memory:" or "mode=memory" in str(parsed):
                raise Invalid("an in-memory SQLite database lives in one connection and the hub uses several; give "
                              "it a file: sqlite:///PATH (or leave --db unset for the one in AMUX_HOME)")
            self.sqlite = SqliteThreads(parsed, echo=echo)
            self.sync_engine: sa.Engine = self.sqlite.engine
            event.listen(self.sync_engine, "connect", _sqlite_connect)
            event.listen(self.sync_engine, "begin", _sqlite_begin)
        else:
            # Connections are kept rather than opened per burst (each new one costs a TCP and auth round trip and a
            # thread-pool DNS lookup); at most 30 per replica.
            self.engine: AsyncEngine = create_async_engine(self.url, echo=echo, pool_size=24, max_overflow=6,
                                                           hide_parameters=True)
            self.sync_engine = self.engine.sync_engine
        self.dialect = self.sync_engine.dialect
        # SQLite is the single-process embedded store: writers are serialized in-process (and take the
        # database lock up front with BEGIN IMMEDIATE), so read-check-write sequences cannot interleave.
        # PostgreSQL uses row locks (`for_update`).
        self._write_lock = asyncio.Lock() if self.is_sqlite else None

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[Connection]:
        """Open a write transaction; commits on success, rolls back on error (no retry: see `transaction`)."""
        if self.sqlite is None or self._write_lock is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._write_lock, self.sqlite.write() as conn:
            yield cast(Connection, conn)

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[Connection]:
        """Open a connection for reads: each statement stands alone and sees every commit made before it, as under
        PostgreSQL's READ COMMITTED (AUTOCOMMIT there: no BEGIN/ROLLBACK round trips; on SQLite each statement runs
        on a reader thread over that thread's own connection, with no BEGIN). Take no row locks on it; a
        read-check-write sequence belongs in `write()`."""
        if self.sqlite is not None:
            yield cast(Connection, SqliteReader(self.sqlite))
            return
        async with self.engine.connect() as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    async def transaction(self, fn: Callable[[Connection], Awaitable[T]]) -> T:
        """Run `fn` in one write transaction; on PostgreSQL run it again (bounded, with backoff) when it failed
        for a transient reason (connection loss, serialization failure, deadlock). `fn` must be safe to re-run:
        it sees nothing of the failed attempt. On SQLite `fn` runs on the writer thread and may await only the
        store (`hub.store.sqlite`)."""
        if self.sqlite is not None and self._write_lock is not None:
            sqlite, body = self.sqlite, cast(Callable[[Any], Coroutine[Any, Any, T]], fn)
            async with self._write_lock:
                return await sqlite.on(sqlite.writer, lambda: sqlite.write_unit(body))
        retrying = AsyncRetrying(stop=stop_after_attempt(self.retry_attempts), reraise=True,
                                 wait=wait_exponential(multiplier=0.05, max=1.0),
                                 retry=retry_if_exception(is_transient),
                                 before_sleep=lambda rs: log.warning(
                                     "transaction retried after %s (attempt %d)",
                                     type(rs.outcome.exception()).__name__ if rs.outcome else "?", rs.attempt_number))
        async for attempt in retrying:
            with attempt:
                async with self.write() as conn:
                    return await fn(conn)
        raise AssertionError("unreachable")  # pragma: no cover

    async def checkpoint(self) -> None:
        """Copy what the SQLite WAL holds back into the database file, without waiting for readers or writers
        (PASSIVE), outside any transaction; the hub runs it every second (`sqlite-checkpoint`). Commits never pay
        for a checkpoint (`wal_autocheckpoint` is off). PostgreSQL: nothing to do."""
        if self.sqlite is not None:
            await SqliteReader(self.sqlite).exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    async def serialize(self, conn: Connection, name: str) -> None:
        """Serialize this transaction with every other one that names `name`, on every replica, until it ends.

        A PostgreSQL transaction-level advisory lock: unlike row locks on shared rows (say, every runtime),
        it cannot deadlock with the writers of those rows. SQLite's writers are serialized already.
        """
        if not self.is_sqlite:
            await conn.execute(_ADVISORY_LOCK, {"b_name": f"amux:{name}"})

    def for_update(self, stmt: sa.Select, *, skip_locked: bool = False,
                   of: sa.FromClause | None = None) -> sa.Select:
        """Add row locks on PostgreSQL (SQLite relies on the in-process writer lock)."""
        if self.is_sqlite:
            return stmt
        return stmt.with_for_update(skip_locked=skip_locked, of=of)

    async def close(self) -> None:
        """Dispose of the pool (and stop SQLite's threads)."""
        if self.sqlite is not None:
            await self.sqlite.close()
        else:
            await self.engine.dispose()


async def execute_many(conn: Connection, stmt: sa.Executable, rows: list[dict[str, Any]]) -> None:
    """Run `stmt` once per parameter set in `rows` inside the caller's transaction: SQLAlchemy's executemany (an
    INSERT's rows in batched multi-row VALUES on PostgreSQL), nothing at all for no rows. Every parameter set names
    the same keys."""
    if rows:
        await conn.execute(stmt, rows)


_ADVISORY_LOCK = sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(sa.bindparam("b_name", type_=sa.Text))))


def require_json_each() -> None:
    """Refuse a SQLite library without its JSON functions: `one_of` binds lists as JSON arrays (`json_each`)."""
    try:
        with contextlib.closing(sqlite3.connect(":memory:")) as probe:
            probe.execute("SELECT value FROM json_each('[]')").fetchall()
    except sqlite3.Error as e:
        raise Invalid(f"this Python's SQLite {sqlite3.sqlite_version} has no JSON functions (json_each: {e}), which "
                      "the hub's statements use; run the hub with a Python whose sqlite3 module links SQLite 3.38 "
                      "or newer (or one built with JSON1), or use PostgreSQL") from None


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


def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    """Each new SQLite connection: WAL, foreign keys, a busy timeout, and no implicit BEGIN of the sqlite3 module
    (`_sqlite_begin` runs the transaction's BEGIN)."""
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=5000",
                   # No checkpoint inside a commit: `Database.checkpoint` runs them in the background, and the last
                   # connection to close checkpoints what is left (SQLite does so whatever this setting).
                   "wal_autocheckpoint=0"):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def _sqlite_begin(conn: sa.Connection) -> None:
    """Begin SQLite's transaction as the connection's `sqlite_begin` execution option says: BEGIN (the default),
    BEGIN IMMEDIATE (a writer takes the write lock up front), or None (no transaction)."""
    begin = conn.get_execution_options().get("sqlite_begin", "BEGIN")
    if begin:
        conn.exec_driver_sql(begin)


def alembic_config(url: str) -> "Config":
    """Return an Alembic config pointing at our migrations and `url`."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = normalize_url(url)
    return cfg


def upgrade_sync(url: str, revision: str = "head") -> None:
    """Apply migrations up to `revision` (blocking; call from a thread inside a loop)."""
    from alembic import command

    if make_url(normalize_url(url)).get_backend_name() == "sqlite":
        prepare_sqlite_file(url)
    command.upgrade(alembic_config(url), revision)


async def schema_lag(db: "Database") -> tuple[tuple[str, ...], str] | None:
    """Return (the database's revisions, the code's head) when the schema is not at the head, else None (reads only:
    nothing is created or upgraded)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(db.url)).get_current_head() or ""
    async with db.read() as conn:
        current = await conn.run_sync(lambda c: tuple(sorted(MigrationContext.configure(c).get_current_heads())))
    return None if current == (head,) else (current, head)


async def upgrade(url: str, revision: str = "head", attempts: int = 10) -> None:
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
