"""Engine factory, transactions and schema upgrades; SQLite/PostgreSQL differences live here."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import sqlite3
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Collection, NamedTuple, TypeVar, Unpack, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util.concurrency import greenlet_spawn
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from ..errors import Invalid
from . import sqlite_driver  # registers the `sqlite+amux` dialect

if TYPE_CHECKING:
    from alembic.config import Config
from ..files import private_file

MIGRATIONS = Path(__file__).resolve().parent.parent.parent / "migrations"


def normalize_url(url: str) -> str:
    """Map plain `postgresql://` and `sqlite://` URLs onto the async drivers."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    if url.startswith("sqlite:///"):
        return "sqlite+aiosqlite:///" + url.split(":///", 1)[1]
    return url


# One connection type on both stores: each SQLite connection runs in its own thread (hub/store/sqlite_driver.py, one
# hop per statement), so no statement blocks the event loop (a backlog of due schedules once starved every timer and
# HTTP handler of the embedded hub). The one exception: a `HotRead` (one small indexed SELECT on a hot path) runs on
# the loop's thread, on a connection that never waits for a lock (`Database._inline_read`).
Connection = AsyncConnection
Row = sa.Row[Unpack[tuple[Any, ...]]]
StoreError = sa.exc.SQLAlchemyError
"""Any error of the store itself (connection lost, a restart, a lock): what a service may tell from a refusal."""
"""A row a store method returns: attribute access by column name (store modules may return their own records)."""
T = TypeVar("T")

log = logging.getLogger("amux.db")

# SQLAlchemy closes the connect coroutine it could not await outside its greenlet (`Database._checkout`'s first try on
# an idle connection the pool must reopen); Python calls that coroutine "never awaited".
warnings.filterwarnings("ignore", r"coroutine '.*' was never awaited", RuntimeWarning, r"sqlalchemy\.util\.concurrency")


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


class HotRead:
    """A hot path's statement, compiled once per dialect: a SELECT run by `Database.hot_read` straight on a pooled
    driver connection (no SQLAlchemy Connection, execution context or result object around it), or any statement
    (an UPDATE ... RETURNING, an INSERT) run by `run` inside the caller's transaction.

    The statement's own bound values are kept; `bindparam(name)` values are given per call. Its rows are named tuples
    with the statement's column keys (a DML statement's: its RETURNING columns), their values converted as
    SQLAlchemy's types convert them. No `IN` over an expanding list (it is compiled per execution): write it with
    `one_of` or `among`.
    """

    def __init__(self, stmt: Any) -> None:
        self.stmt = stmt
        self.columns = list(stmt.selected_columns if isinstance(stmt, sa.Select) else stmt.exported_columns)
        self.keys = [c.key for c in self.columns]
        self.row = collections.namedtuple("HotRow", self.keys or ["_"], rename=True)  # type: ignore[misc]
        self._compiled: dict[str, _CompiledRead] = {}

    def compiled(self, dialect: sa.Dialect) -> "_CompiledRead":
        """Return the statement compiled for `dialect` (once per dialect)."""
        key = f"{dialect.name}+{dialect.driver}"
        done = self._compiled.get(key)
        if done is None:
            done = self._compiled[key] = _CompiledRead(self.stmt, self.columns, dialect)
        return done


class HotResult(NamedTuple):
    """What `run` returns: the rows (named tuples, `HotRead.row`) and the count of rows the statement
    matched (an UPDATE's or DELETE's; for a SELECT, the rows)."""

    rows: list[Any]
    rowcount: int


class _CompiledRead:
    """A HotRead's SQL text for one dialect, its positional parameters and its columns' result conversions."""

    __slots__ = ("sql", "binds", "processors")

    def __init__(self, stmt: Any, columns: list[Any], dialect: sa.Dialect) -> None:
        compiled = stmt.compile(dialect=dialect)
        if any(b.expanding for b in compiled.binds.values()):
            raise TypeError("a HotRead cannot hold an expanding IN; write it with one_of() or among()")
        self.sql = compiled.string
        self.binds = [(name, compiled.binds[name].value, compiled.binds[name].type.dialect_impl(dialect)
                       .bind_processor(dialect)) for name in (compiled.positiontup or ())]
        self.processors = [c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns]

    def parameters(self, given: dict[str, Any]) -> list[Any]:
        """Return the positional parameters: the given values by name, else the statement's own."""
        out = []
        for name, default, process in self.binds:
            value = given.get(name, default)
            out.append(process(value) if process is not None else value)
        return out

    def rows(self, raw: Any, row: Callable[..., Any]) -> list[Any]:
        """Convert the driver's rows as SQLAlchemy's result types would."""
        procs = self.processors
        if not any(procs):
            return [row(*r) for r in raw]
        return [row(*(p(v) if p is not None else v for p, v in zip(procs, r))) for r in raw]


class Database:
    """One engine plus the rules for transactions on its dialect."""

    def __init__(self, url: str, *, echo: bool = False, retry_attempts: int = 3) -> None:
        self.url = normalize_url(url)
        parsed = make_url(self.url)
        backend = parsed.get_backend_name()
        if backend not in ("sqlite", "postgresql"):
            raise Invalid(f"unsupported database {backend!r}; use sqlite+aiosqlite:///PATH or postgresql+asyncpg://HOST/DB")
        self.is_sqlite = backend == "sqlite"
        self.retry_attempts = retry_attempts
        # hide_parameters: an error's message and log line never carry a prompt, memory value or secret.
        if self.is_sqlite:
            require_json_each()
            prepare_sqlite_file(self.url)
            self.engine: AsyncEngine = create_async_engine(parsed.set(drivername="sqlite+amux"), echo=echo,
                                                           hide_parameters=True, pool_size=8, max_overflow=24)
            event.listen(self.engine.sync_engine, "connect", _sqlite_connect)
        else:
            # Connections are kept rather than opened per burst (each new one costs a TCP and auth round trip and a
            # thread-pool DNS lookup); at most 30 per replica, as before.
            self.engine = create_async_engine(self.url, echo=echo, pool_size=24, max_overflow=6, hide_parameters=True)
        # SQLite is the single-process embedded store: writers are serialized in-process (and take the
        # database lock up front with BEGIN IMMEDIATE), so read-check-write sequences cannot interleave.
        # PostgreSQL uses row locks (`for_update`).
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        # SQLite: the hot reads' own connection, used on the event loop's thread (`_inline_read`).
        database = parsed.database if self.is_sqlite else None
        self._inline_path = database if database and database != ":memory:" and not database.startswith("file:") \
            else None
        self._inline: sqlite3.Connection | None = None

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[Connection]:
        """Open a write transaction; commits on success, rolls back on error (no retry: see `transaction`)."""
        if self._write_lock is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._write_lock:
            conn = await self.engine.connect()
            try:
                conn = await conn.execution_options(sqlite_begin="BEGIN IMMEDIATE")  # the write lock before any read
                trans = await conn.begin()
                try:
                    yield conn
                except BaseException:
                    await asyncio.shield(trans.rollback())
                    raise
                await asyncio.shield(trans.commit())
            finally:
                # A cancelled writer (shutdown, a client gone) must still end its transaction now: left to the
                # garbage collector, SQLite's write lock outlives it and the next writer waits `busy_timeout`.
                await asyncio.shield(conn.close())

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[Connection]:
        """Open a connection for reads; its statements share one transaction (on SQLite one WAL snapshot, its BEGIN
        run in the first statement's hop and its ROLLBACK not waited for)."""
        async with self.engine.connect() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def lazy_read(self) -> AsyncIterator[Connection]:
        """`read()` whose connection is taken from the pool at its first statement, and not at all by a caller that
        runs none: a submission of a builtin profile reads nothing (its choices come from code and a cached check),
        and taking and returning a connection for it was ~0.06 ms of each `task_submit` (bench/dispatch)."""
        lazy = _LazyConnection(self)
        async with lazy.stack:  # closes the connection if one was opened (with the body's exception, if any)
            yield cast(Connection, lazy)

    @contextlib.asynccontextmanager
    async def autocommit(self) -> AsyncIterator[Connection]:
        """Open a connection whose statements each stand alone, with no transaction around them: for a hot path's
        one read (one round trip on PostgreSQL instead of BEGIN, the read and ROLLBACK; no BEGIN on SQLite). Several
        statements on it see different moments, as under READ COMMITTED; take no row locks on it."""
        async with self.engine.connect() as conn:
            if self.is_sqlite:
                yield await conn.execution_options(sqlite_begin=None)
            else:
                yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    async def hot_read(self, read: HotRead, params: dict[str, Any] | None = None) -> list[Any]:
        """Run a hot path's one SELECT on a connection of the pool, outside any transaction, and return its rows.

        Like one statement on `autocommit()`: it sees every commit made before it, on any replica, and takes no lock.
        It costs a pool checkout, the driver's call and the checkin, without SQLAlchemy's Connection around them
        (on SQLite one hop into the connection's thread; on PostgreSQL one round trip). A connection whose read
        failed is closed and the read runs once more the ordinary way, which raises SQLAlchemy's error if it fails
        again (a connection lost to a restart is replaced, as a pre-ping would). The engine's `before_cursor_execute`
        listeners see the statement, with no connection or cursor.
        """
        compiled = read.compiled(self.engine.dialect)
        args = compiled.parameters(params or {})
        watchers = self.engine.sync_engine.dispatch.before_cursor_execute
        if watchers:  # whoever counts the engine's statements sees this one too (connection, cursor: None)
            watchers(None, None, compiled.sql, args, None, False)
        if self._inline_path is not None:
            raw = self._inline_read(compiled.sql, args)
            if raw is not None:
                return compiled.rows(raw, read.row)
        fairy = await self._checkout()
        try:
            driver: Any = fairy.dbapi_connection
            if self.is_sqlite:
                raw = await driver.read_rows(compiled.sql, args)
            else:
                raw = await driver.driver_connection.fetch(compiled.sql, *args)
        except Exception as e:  # noqa: BLE001 — the ordinary path below raises the store's own error
            fairy.invalidate(e)
            fairy.close()
            async with self.autocommit() as conn:
                return await self.read_rows(conn, read, params)
        except BaseException as e:  # cancelled mid-call: the connection's state is unknown, it is not reused
            fairy.invalidate(e)
            fairy.close()
            raise
        fairy.close()
        return compiled.rows(raw, read.row)

    def _inline_read(self, sql: str, args: list[Any]) -> list[Any] | None:
        """Run a SQLite hot read on the event loop's own thread, on a query-only connection that never waits for a
        lock (`busy_timeout` 0); None when SQLite said busy or failed, and the read goes through the pool instead.

        A hot read is one small indexed SELECT (a profile list, a lease and its boxes): in WAL mode it takes no lock
        a writer holds, and runs in ~15 µs, less than the two thread switches of a hop into a pooled connection's
        thread (~45 µs of the loop's CPU, bench/mcp_calls). Big reads stay in their connections' threads.
        """
        reader = self._inline
        try:
            if reader is None:
                reader = self._inline = sqlite3.connect(self._inline_path or "", isolation_level=None)
                reader.execute("PRAGMA busy_timeout=0")
                reader.execute("PRAGMA query_only=ON")
            return reader.execute(sql, args).fetchall()
        except sqlite3.Error:
            return None

    async def _checkout(self) -> Any:
        """Take a DBAPI connection from the pool: an idle one directly, else in SQLAlchemy's greenlet (a new
        connection, or waiting for one, is awaited there)."""
        pool: Any = self.engine.sync_engine.pool  # a QueuePool (SQLite files, PostgreSQL) or a StaticPool (memory)
        if getattr(pool, "checkedin", lambda: 0)():
            try:
                return pool.connect()
            except sa.exc.MissingGreenlet:  # the idle one had to reconnect; the pool took it back
                pass
        return await greenlet_spawn(pool.connect)

    async def read_rows(self, conn: Connection | None, read: HotRead,
                        params: dict[str, Any] | None = None) -> list[Any]:
        """Run `read` on `conn` (inside the caller's transaction), or with no connection as a `hot_read`; the rows
        are the same named tuples either way."""
        if conn is None:
            return await self.hot_read(read, params)
        return [read.row(*r) for r in await conn.execute(read.stmt, params or {})]

    async def transaction(self, fn: Callable[[Connection], Awaitable[T]]) -> T:
        """Run `fn` in one write transaction; on PostgreSQL run it again (bounded, with backoff) when it failed
        for a transient reason (connection loss, serialization failure, deadlock). `fn` must be safe to re-run:
        it sees nothing of the failed attempt."""
        if self.is_sqlite:
            async with self.write() as conn:
                return await fn(conn)
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
        (PASSIVE), in a connection's own thread; the hub runs it every second (`sqlite-checkpoint`). Commits never
        pay for a checkpoint (`wal_autocheckpoint` is off): one commit in ~125 used to, 7 ms of the write lock on
        this disk (docs/performance.md). PostgreSQL: nothing to do."""
        if self.is_sqlite:
            async with self.autocommit() as conn:
                await conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    async def serialize(self, conn: Connection, name: str) -> None:
        """Serialize this transaction with every other one that names `name`, on every replica, until it ends.

        A PostgreSQL transaction-level advisory lock: unlike row locks on shared rows (say, every runtime),
        it cannot deadlock with the writers of those rows. SQLite's writers are serialized already.
        """
        if not self.is_sqlite:
            await run(conn, _ADVISORY_LOCK, {"b_name": f"amux:{name}"})

    def for_update(self, stmt: sa.Select, *, skip_locked: bool = False,
                   of: sa.FromClause | None = None) -> sa.Select:
        """Add row locks on PostgreSQL (SQLite relies on the in-process writer lock)."""
        if self.is_sqlite:
            return stmt
        return stmt.with_for_update(skip_locked=skip_locked, of=of)

    async def close(self) -> None:
        """Dispose of the pool (and close the hot reads' own SQLite connection)."""
        if self._inline is not None:
            self._inline.close()
            self._inline = None
        await self.engine.dispose()


class _LazyConnection:
    """The connection `Database.lazy_read` hands out: each awaited method of SQLAlchemy's AsyncConnection (execute,
    scalar, stream, run_sync, ...) opens the real connection on first use, and then runs on it; its statements share
    one transaction, as `read()`'s do."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.stack = contextlib.AsyncExitStack()
        self._conn: AsyncConnection | None = None

    async def _open(self) -> AsyncConnection:
        if self._conn is None:
            self._conn = await self.stack.enter_async_context(self._db.read())
        return self._conn

    def __getattr__(self, name: str) -> Any:
        method = getattr(AsyncConnection, name, None)
        if not asyncio.iscoroutinefunction(method):
            raise AttributeError(f"a lazy read connection offers only AsyncConnection's awaited methods, not {name!r}")

        async def call(*args: Any, **kw: Any) -> Any:
            return await getattr(await self._open(), name)(*args, **kw)

        return call


async def run(conn: Connection, hot: HotRead, params: dict[str, Any] | None = None) -> HotResult:
    """Run a hot statement inside the caller's transaction on `conn` and return its rows and row count.

    On PostgreSQL it goes straight to asyncpg on the transaction's own connection (its prepared statement, in the
    transaction SQLAlchemy began there): SQLAlchemy's execution path costs ~70 µs of CPU a statement more
    (bench/dispatch runs ~6 of them a task). Its errors are SQLAlchemy's (`IntegrityError`, `OperationalError` ...),
    and a lost connection is invalidated, as SQLAlchemy's own path does. On SQLite (and on a driver connection this
    does not know) it runs through SQLAlchemy as any statement.
    """
    dialect = conn.dialect
    driver = _asyncpg_of(conn) if dialect.name == "postgresql" else None
    if driver is None:
        res = await conn.execute(hot.stmt, params or {})
        rows = [hot.row(*r) for r in res] if res.returns_rows else []
        return HotResult(rows, len(rows) if isinstance(hot.stmt, sa.Select) else res.rowcount)
    compiled = hot.compiled(dialect)
    raw, status = await _on_driver(conn, driver, compiled.sql, compiled.parameters(params or {}))
    rows = compiled.rows(raw, hot.row)
    count = status.rsplit(" ", 1)[-1]
    return HotResult(rows, int(count) if count.isdigit() else len(rows))


async def run_many(conn: Connection, hot: HotRead, rows: list[dict[str, Any]]) -> None:
    """Run a hot INSERT or UPDATE once per parameter set in `rows`, inside the caller's transaction on `conn`.

    On PostgreSQL it is one asyncpg `executemany` of the prepared statement on the transaction's own connection (one
    pipelined batch, as SQLAlchemy's own executemany on asyncpg, without building and processing the statement per
    call), with SQLAlchemy's errors as `run` raises them. On SQLite (and on a driver connection this does not know)
    it is SQLAlchemy's executemany. Every parameter set names every `bindparam` of the statement.
    """
    if not rows:
        return
    dialect = conn.dialect
    driver = _asyncpg_of(conn) if dialect.name == "postgresql" else None
    if driver is None:
        await conn.execute(hot.stmt, rows)
        return
    compiled = hot.compiled(dialect)
    await _on_driver(conn, driver, compiled.sql, [compiled.parameters(r) for r in rows], many=True)


async def _on_driver(conn: Connection, driver: Any, sql: str, args: list[Any], *,
                     many: bool = False) -> tuple[list[Any], str]:
    """Run `sql` on the asyncpg connection of `conn`'s transaction (`run`, `run_many`): the engine's statement
    listeners told first, the BEGIN SQLAlchemy defers issued if need be, the statement prepared through the adapter's
    cache; return the raw rows and the status message (none for `many`), or raise SQLAlchemy's error for a failure."""
    watchers = conn.engine.sync_engine.dispatch.before_cursor_execute
    if watchers:  # whoever counts the engine's statements sees this one too (cursor: None)
        watchers(conn.sync_connection, None, sql, args, None, many)
    try:
        async with driver._execute_mutex:  # noqa: SLF001 — SQLAlchemy's asyncpg adapter: one statement at a time
            if driver._transaction is None:  # noqa: SLF001 — the BEGIN SQLAlchemy defers to the first statement
                await driver._start_transaction()  # noqa: SLF001
            asof = conn.dialect._invalidate_schema_cache_asof  # type: ignore[attr-defined]  # noqa: SLF001
            prepared, _ = await driver._prepare(sql, asof)  # noqa: SLF001 — its prepared-statement cache
            if many:
                await prepared.executemany(args)
                return [], ""
            return await prepared.fetch(*args), prepared.get_statusmsg() or ""
    except Exception as e:  # noqa: BLE001 — raised again as SQLAlchemy's error for it
        raise await _translated(conn, driver, sql, args, e) from e


_INSERTS: dict[tuple[str, tuple[str, ...]], HotRead] = {}


def insert_statement(table: sa.Table, keys: tuple[str, ...]) -> HotRead:
    """The INSERT of columns `keys` of `table`, each bound as `b_<column>` (built once per table and columns)."""
    hot = _INSERTS.get((table.name, keys))
    if hot is None:
        hot = _INSERTS[(table.name, keys)] = HotRead(table.insert().inline().values(  # inline: no RETURNING of ids
            {k: sa.bindparam(f"b_{k}", type_=table.c[k].type) for k in keys}))
    return hot


_PLAIN_INSERTS: dict[str, sa.Insert] = {}


async def insert_many(conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Insert rows of `table` (dicts by column name) inside the caller's transaction: on PostgreSQL one `run_many`
    when every row names the same columns (the hot paths' batches do); else SQLAlchemy's executemany, as before."""
    if not rows:
        return
    keys = tuple(rows[0])
    if conn.dialect.name != "postgresql" or any(tuple(r) != keys for r in rows):
        plain = _PLAIN_INSERTS.get(table.name)
        if plain is None:
            plain = _PLAIN_INSERTS[table.name] = table.insert()
        await conn.execute(plain, rows)
        return
    await run_many(conn, insert_statement(table, keys), [{f"b_{k}": v for k, v in r.items()} for r in rows])


async def _translated(conn: Connection, driver: Any, sql: str, args: list[Any], error: Exception) -> Exception:
    """The SQLAlchemy error SQLAlchemy's own path raises for a driver error (a lost connection invalidated)."""
    dialect = conn.dialect
    try:
        driver._handle_exception(error)  # noqa: SLF001 — maps asyncpg's error onto the DBAPI's classes
    except Exception as dbapi_error:  # noqa: BLE001
        error = dbapi_error
    lost = isinstance(error, dialect.loaded_dbapi.Error) and dialect.is_disconnect(error, driver, None)
    wrapped = sa.exc.DBAPIError.instance(sql, args, error, dialect.loaded_dbapi.Error, hide_parameters=True,
                                         dialect=dialect, connection_invalidated=lost)
    if lost:
        await conn.invalidate()
    return wrapped


_ADVISORY_LOCK = HotRead(sa.select(
    sa.func.pg_advisory_xact_lock(sa.func.hashtext(sa.bindparam("b_name", type_=sa.Text))).label("locked")))


def _asyncpg_of(conn: Connection) -> Any:
    """The SQLAlchemy asyncpg adapter under `conn`'s checked-out connection, or None (not asyncpg, not connected, or
    an adapter without the parts `run` uses)."""
    sync = conn.sync_connection
    fairy = getattr(sync, "_dbapi_connection", None) if sync is not None else None
    driver = getattr(fairy, "dbapi_connection", None)
    if driver is None or not all(hasattr(driver, a) for a in ("_execute_mutex", "_start_transaction", "_prepare",
                                                              "_transaction", "_handle_exception")):
        return None
    return driver


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


def _sqlite_connect(dbapi_conn: sqlite_driver.AmuxSqliteConnection, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # the driver runs the engine's BEGIN itself (`sqlite_begin`)
    dbapi_conn.run_sync(_sqlite_pragmas)


def _sqlite_pragmas(dbapi_conn: Any) -> None:
    dbapi_conn.execute("PRAGMA journal_mode=WAL")
    dbapi_conn.execute("PRAGMA synchronous=NORMAL")
    dbapi_conn.execute("PRAGMA foreign_keys=ON")
    dbapi_conn.execute("PRAGMA busy_timeout=5000")
    # No checkpoint inside a commit: `Database.checkpoint` runs them in the background, and the last connection
    # to close checkpoints what is left (SQLite does so whatever this setting).
    dbapi_conn.execute("PRAGMA wal_autocheckpoint=0")


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
