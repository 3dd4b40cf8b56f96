"""SQLAlchemy's asyncio engine on SQLite with one thread hop per statement (dialect `sqlite+amux`).

Every connection owns one thread that alone touches its `sqlite3` connection, so no statement runs on the event loop
(issue 12). A hop into that thread costs far more CPU than SQLite itself (a primary-key SELECT is ~7 µs in sqlite3,
a hop tens of µs), so each DBAPI call is one hop or none:

- `execute`/`executemany` run the statement, read its description, fetch every row and read rowcount and lastrowid
  in one call into the thread (aiosqlite's adapter took four: cursor, execute, fetchall, close);
- a transaction's BEGIN is not a hop of its own: the engine's begin hands it to the next statement, which runs it
  first in the same call (a transaction that runs no statement never begins). Which BEGIN is the connection's
  `sqlite_begin` execution option: BEGIN (the default), BEGIN IMMEDIATE, or None for no transaction at all;
- COMMIT and ROLLBACK are one hop when a transaction is open and none when it is not (the pool's reset-on-return
  ROLLBACK after a commit or on an autocommit connection costs nothing). A transaction that cannot hold SQLite's
  write lock (a plain BEGIN that changed nothing and ran only statements with result columns) is ended without
  waiting: nobody waits for its lock, and the connection's next call runs after it.

Whether a transaction is open is what the thread saw after its last call; while a call is in flight (a cancelled
statement still running) it is not trusted and COMMIT/ROLLBACK go to the thread and wait, queued behind that call.
Calls into one connection's thread run in the order they were made, even when their caller was cancelled.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import sqlite3
import threading
from queue import SimpleQueue
from typing import Any, Callable, Iterator, Sequence

from sqlalchemy import pool
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import AdaptedConnection
from sqlalchemy.engine.characteristics import ConnectionCharacteristic
from sqlalchemy.engine.url import URL
from sqlalchemy.util.concurrency import await_, in_greenlet

DEFAULT_BEGIN = "BEGIN"
_STOP = object()
log = logging.getLogger("amux.db")
_Result = tuple[Any, Any, int, int | None]  # description, rows, rowcount, lastrowid


class _Worker:
    """One thread owning one sqlite3 connection; runs the functions it is given there, in order.

    The thread alone writes `done` and the transaction state after each call, the loop alone writes `submitted`:
    when the two counts are equal nothing is in flight and the state is what SQLite says now.
    """

    __slots__ = ("conn", "submitted", "done", "in_transaction", "holds_write", "begun", "_jobs", "_thread")

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.submitted = self.done = 0
        self.in_transaction = False
        self.holds_write = False  # the open transaction may hold SQLite's write lock (it wrote, or began IMMEDIATE)
        self.begun: tuple[str, int] | None = None  # this transaction's BEGIN and total_changes then (None: unknown)
        self._jobs: SimpleQueue[tuple[asyncio.Future[Any] | None, Callable[[_Worker], Any]]] = SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="amux-sqlite", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            future, fn = self._next_job()
            try:
                result, ok = fn(self), True
            except BaseException as e:  # noqa: BLE001 — handed to the caller on the loop
                result, ok = e, False
            try:
                self._observe()
            except sqlite3.Error:  # a connection closed behind our back: assume the worst until it is replaced
                self.in_transaction = self.holds_write = True
            self.done += 1
            if future is not None:
                try:
                    future.get_loop().call_soon_threadsafe(_settle, future, ok, result)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    pass
            elif not ok:
                log.warning("a posted SQLite call failed: %s", type(result).__name__)
            if result is _STOP:
                return

    def _next_job(self) -> tuple[asyncio.Future[Any] | None, Callable[[_Worker], Any]]:
        """Wait for the next call (its own frame, so profiles tell this wait from work: bench/topframes.py)."""
        return self._jobs.get()

    def _observe(self) -> None:
        conn = self.conn
        self.in_transaction = conn is not None and conn.in_transaction
        if not self.in_transaction:
            self.begun = None
            self.holds_write = False
            return
        assert conn is not None
        begun = self.begun
        self.holds_write = begun is None or begun[0] != "BEGIN" or conn.total_changes != begun[1]

    def submit(self, fn: Callable[[_Worker], Any], *, wait: bool = True) -> asyncio.Future[Any] | None:
        """Queue `fn(worker)` for the thread; return a future of its result (None with `wait=False`)."""
        future = asyncio.get_running_loop().create_future() if wait else None
        self.submitted += 1
        self._jobs.put((future, fn))
        return future

    def call(self, fn: Callable[[_Worker], Any]) -> Any:
        """Run `fn(worker)` in the thread and return its result: one hop (from inside SQLAlchemy's greenlet)."""
        return await_(self.submit(fn))  # type: ignore[arg-type]

    @property
    def settled(self) -> bool:
        """No call is in flight: the transaction state is what SQLite says now."""
        return self.submitted == self.done


def _settle(future: asyncio.Future[Any], ok: bool, result: Any) -> None:
    if future.done():  # the waiter was cancelled; the call ran all the same
        return
    if ok:
        future.set_result(result)
    else:
        future.set_exception(result)


def _open(database: str, kwargs: dict[str, Any]) -> Callable[[_Worker], None]:
    def connect(worker: _Worker) -> None:
        # isolation_level None: sqlite3 never issues BEGIN or COMMIT on its own; the engine's transactions do
        worker.conn = sqlite3.connect(database, **{**kwargs, "isolation_level": None, "check_same_thread": True})
    return connect


def _closed(worker: _Worker) -> sqlite3.Connection:
    if worker.conn is None:
        raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
    return worker.conn


def _execute(begin: str | None, operation: str, parameters: Any, many: bool) -> Callable[[Any], _Result]:
    def run(worker: _Worker) -> _Result:
        conn = _closed(worker)
        if begin is not None:
            conn.execute(begin)
            worker.begun = (begin, conn.total_changes)
        cursor = conn.cursor()
        try:
            if many:
                cursor.executemany(operation, parameters)
            elif parameters is None:
                cursor.execute(operation)
            else:
                cursor.execute(operation, parameters)
            description = cursor.description
            if description is None:  # a write (or DDL): it may hold the write lock even when it changed no row
                worker.begun = None
            rows = cursor.fetchall() if description else None
            return description, rows, cursor.rowcount, cursor.lastrowid
        finally:
            cursor.close()
    return run


def _end(verb: str) -> Callable[[Any], None]:
    def run(worker: _Worker) -> None:
        conn = _closed(worker)
        if conn.in_transaction:
            conn.execute(verb)
    return run


def _close(worker: _Worker) -> object:
    conn, worker.conn = worker.conn, None
    if conn is not None:
        conn.close()
    return _STOP


class AmuxSqliteCursor:
    """A DBAPI cursor whose `execute` is one hop and whose rows are already on the loop's side."""

    __slots__ = ("_connection", "description", "rowcount", "lastrowid", "arraysize", "_rows")
    server_side = False

    def __init__(self, connection: AmuxSqliteConnection) -> None:
        self._connection = connection
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self.arraysize = 1
        self._rows: collections.deque[Any] = collections.deque()

    def execute(self, operation: str, parameters: Any = None) -> None:
        self._take(self._connection.run_statement(operation, parameters, many=False))

    def executemany(self, operation: str, seq_of_parameters: Sequence[Any]) -> None:
        self._take(self._connection.run_statement(operation, seq_of_parameters, many=True))

    def _take(self, result: _Result) -> None:
        self.description, rows, self.rowcount, self.lastrowid = result
        self._rows = collections.deque(rows) if rows else collections.deque()

    async def _async_soft_close(self) -> None:
        """Nothing to release: the thread closed its cursor before handing the rows over."""

    def close(self) -> None:
        self._rows.clear()

    def setinputsizes(self, *_sizes: Any) -> None:
        pass

    def setoutputsize(self, *_args: Any) -> None:
        pass

    def nextset(self) -> None:
        return None

    def fetchone(self) -> Any:
        return self._rows.popleft() if self._rows else None

    def fetchmany(self, size: int | None = None) -> list[Any]:
        rows = self._rows
        return [rows.popleft() for _ in range(min(size or self.arraysize, len(rows)))]

    def fetchall(self) -> list[Any]:
        rows = list(self._rows)
        self._rows.clear()
        return rows

    def __iter__(self) -> Iterator[Any]:
        while self._rows:
            yield self._rows.popleft()

    def __enter__(self) -> AmuxSqliteCursor:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


class AmuxSqliteConnection(AdaptedConnection):
    """The DBAPI connection SQLAlchemy sees; every call is one hop into the connection's thread, or none."""

    __slots__ = ("dbapi", "_worker", "begin_statement", "_begin", "_isolation_level")

    def __init__(self, dbapi: Any, worker: _Worker) -> None:
        self.dbapi = dbapi
        self._worker = worker
        self._connection = worker  # type: ignore[assignment]  # `driver_connection`: the thread owning sqlite3's
        self.begin_statement: str | None = DEFAULT_BEGIN  # what the engine's begin runs (the `sqlite_begin` option)
        self._begin: str | None = None  # a BEGIN the next statement runs first
        self._isolation_level: str | None = ""  # sqlite3's default, until the connect listener says None

    def begin(self) -> None:
        """Open a transaction with `begin_statement`, in the same hop as the next statement (none: no transaction,
        each statement commits on its own)."""
        self._begin = self.begin_statement

    def run_statement(self, operation: str, parameters: Any, *, many: bool) -> _Result:
        begin, self._begin = self._begin, None
        return self._worker.call(_execute(begin, operation, parameters, many))

    async def read_rows(self, operation: str, parameters: Sequence[Any]) -> list[Any]:
        """Run one SELECT outside any transaction (it sees every commit made before it) and return its rows: one
        hop, awaited from the loop without SQLAlchemy's greenlet (`Database.hot_read`). The connection must have no
        transaction open, as one just checked out of the pool has not."""
        future = self._worker.submit(_execute(None, operation, parameters, False))
        assert future is not None
        return (await future)[1] or []

    def cursor(self, server_side: bool = False) -> AmuxSqliteCursor:
        return AmuxSqliteCursor(self)

    def execute(self, operation: str, parameters: Any = None) -> AmuxSqliteCursor:
        cursor = self.cursor()
        cursor.execute(operation, parameters)
        return cursor

    def commit(self) -> None:
        self._end("COMMIT")

    def rollback(self) -> None:
        self._end("ROLLBACK")

    def _end(self, verb: str) -> None:
        """End the open transaction: no hop when none is open; one that cannot hold the write lock is ended without
        waiting (nobody waits for its lock, and this thread's next call runs after it); else one hop."""
        self._begin = None  # a transaction that ran no statement never began
        worker = self._worker
        if worker.settled and not worker.in_transaction:
            return
        if worker.settled and not worker.holds_write:
            worker.submit(_end(verb), wait=False)
            return
        worker.call(_end(verb))

    @property
    def isolation_level(self) -> str | None:
        return self._isolation_level

    @isolation_level.setter
    def isolation_level(self, value: str | None) -> None:
        """sqlite3's own implicit transactions stay off (the engine's BEGIN does it); only the value is kept for
        SQLAlchemy's autocommit detection."""
        self._isolation_level = value

    def create_function(self, *args: Any, **kwargs: Any) -> None:
        self._worker.call(lambda worker: _closed(worker).create_function(*args, **kwargs))

    def run_sync(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run `fn(sqlite3_connection)` in the connection's thread (one hop): for setup such as PRAGMAs."""
        return self._worker.call(lambda worker: fn(_closed(worker)))

    def close(self) -> None:
        self._worker.call(_close)

    def terminate(self) -> None:
        """Close a connection SQLAlchemy gave up on: one invalidated (its statement cancelled, say) waits for the close,
        queued behind that statement, so its transaction and write lock are gone before the next writer begins;
        one the collector found (outside the engine's greenlet) is closed without waiting."""
        if not in_greenlet():
            self._worker.submit(_close, wait=False)
            return
        future = self._worker.submit(_close)
        assert future is not None
        await_(asyncio.shield(future))


class _DBAPI:
    """The DBAPI module the dialect sees: sqlite3's exceptions and constants, and a `connect` that starts a thread."""

    paramstyle = "qmark"

    def __init__(self) -> None:
        for name in ("DatabaseError", "DataError", "Error", "IntegrityError", "InterfaceError", "InternalError",
                     "NotSupportedError", "OperationalError", "ProgrammingError", "Warning", "sqlite_version",
                     "sqlite_version_info", "PARSE_COLNAMES", "PARSE_DECLTYPES", "Binary"):
            setattr(self, name, getattr(sqlite3, name))

    def connect(self, database: str, **kwargs: Any) -> AmuxSqliteConnection:
        worker = _Worker()
        try:
            worker.call(_open(database, kwargs))
        except BaseException:
            worker.submit(_close, wait=False)
            raise
        return AmuxSqliteConnection(self, worker)


class _BeginStatement(ConnectionCharacteristic):
    """The `sqlite_begin` execution option: the statement that opens the connection's transactions (BEGIN,
    BEGIN IMMEDIATE, or None for none); back to BEGIN when the connection returns to the pool."""

    transactional = True

    def reset_characteristic(self, dialect: Any, dbapi_conn: Any) -> None:
        dbapi_conn.begin_statement = DEFAULT_BEGIN

    def set_characteristic(self, dialect: Any, dbapi_conn: Any, value: Any) -> None:
        dbapi_conn.begin_statement = value

    def get_characteristic(self, dialect: Any, dbapi_conn: Any) -> Any:
        return dbapi_conn.begin_statement


class SQLiteDialect_amux(SQLiteDialect_pysqlite):
    """pysqlite's SQL dialect over `AmuxSqliteConnection`; the engine's begin runs the connection's
    `begin_statement` (set per connection with the `sqlite_begin` execution option)."""

    driver = "amux"
    supports_statement_cache = True
    is_async = True
    has_terminate = True
    supports_server_side_cursors = False
    connection_characteristics = SQLiteDialect_pysqlite.connection_characteristics.union(
        {"sqlite_begin": _BeginStatement()})

    def do_begin(self, dbapi_connection: Any) -> None:
        getattr(dbapi_connection, "dbapi_connection", dbapi_connection).begin()  # the pool's proxy, or the adapter

    @classmethod
    def import_dbapi(cls) -> Any:
        return _DBAPI()

    @classmethod
    def get_pool_class(cls, url: URL) -> type[pool.Pool]:
        return pool.AsyncAdaptedQueuePool if cls._is_url_file_db(url) else pool.StaticPool

    def create_connect_args(self, url: URL) -> Any:
        args, kwargs = super().create_connect_args(url)
        kwargs.pop("check_same_thread", None)  # the connection's own thread is the only one that touches it
        return args, kwargs

    def get_driver_connection(self, connection: Any) -> Any:
        return connection.driver_connection

    def do_terminate(self, dbapi_connection: Any) -> None:
        dbapi_connection.terminate()


registry.register("sqlite.amux", __name__, "SQLiteDialect_amux")
