"""The embedded SQLite store's threads: a whole write transaction is one call on the writer thread.

SQLAlchemy's synchronous engine over the standard sqlite3 driver, driven from the event loop:

- `transaction(fn)`: the body `fn(conn)` runs on the one writer thread, its statements and its commit, and the
  event loop hops there and back once. The body is the same `async def` that runs on PostgreSQL; here each
  `await conn.execute(...)` finishes at once (`run_body` drives the coroutine to its end without an event loop), so
  a body may await only the store. Awaiting anything else (a network call, a lock, a sleep) is refused with an
  error naming the body: that work belongs before or after the transaction.
- `write()` (a transaction whose statements the caller awaits one by one): one hop per statement to the writer
  thread. `read()`: one hop per statement to one of a few reader threads, each with its own connection and no
  transaction (WAL: readers never wait for the writer).

Every result comes back with its rows fetched, so it can be read on any thread after its connection is gone.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Coroutine, Iterator, TypeVar

import sqlalchemy as sa

T = TypeVar("T")
READERS = 4  # reader threads (and pooled read connections); the writer has its own thread and connection


class Fetched:
    """A statement's result with its rows already fetched (`Result.freeze`), plus the `rowcount` it reported."""

    def __init__(self, result: sa.CursorResult[Any]) -> None:
        self.rowcount = result.rowcount
        self._rows = result.freeze()()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rows, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)


def fetched(result: sa.CursorResult[Any]) -> Any:
    """Return `result` with its rows fetched (a statement without rows keeps its own result: rowcount, keys)."""
    return Fetched(result) if result.returns_rows else result


def run_body(body: Coroutine[Any, Any, T]) -> T:
    """Run a transaction body on this (database) thread, to its end; refuse one that awaits anything but the store."""
    try:
        while True:
            awaited = body.send(None)
            if awaited is not None:  # a bare yield (`asyncio.sleep(0)`) is harmless; a future is not
                break
    except StopIteration as done:
        return done.value
    body.close()
    raise RuntimeError(
        f"a SQLite transaction body ({getattr(body, '__qualname__', body)}) awaited {awaited!r}, which is not a "
        "statement: a transaction body may await only the store; do that work before the transaction or after it "
        "commits")


class SqliteConnection:
    """One SQLite connection, answering the calls the store makes on an `AsyncConnection`.

    `hop` starts a function on one of the connection's threads and returns its future (one hop per statement);
    None when the caller is on that thread already (a transaction body run by `run_body`): the statement runs at
    once. A connection runs one statement at a time, and a statement whose caller was cancelled still finishes
    before the connection is closed (`settle`): sqlite3 must never see one connection on two threads at once.
    """

    def __init__(self, conn: sa.Connection, hop: Callable[[Callable[[], Any]], asyncio.Future[Any]] | None) -> None:
        self.sync_connection = conn
        self.dialect = conn.dialect
        self._hop = hop
        self._turn = asyncio.Lock() if hop is not None else None
        self._running: asyncio.Future[Any] | None = None

    async def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` (a statement, a commit) on the connection's thread once the one before it has finished."""
        if self._hop is None or self._turn is None:
            return fn()
        async with self._turn:
            await self.settle()
            self._running = self._hop(fn)
            return await asyncio.shield(self._running)

    async def settle(self) -> None:
        """Wait for the statement in flight, if any (its caller may have been cancelled), and forget its outcome."""
        if self._running is not None and not self._running.done():
            await asyncio.wait([self._running])

    async def execute(self, statement: Any, parameters: Any = None, **kw: Any) -> Any:
        return await self.call(lambda: fetched(self.sync_connection.execute(statement, parameters, **kw)))

    async def exec_driver_sql(self, statement: str, parameters: Any = None, **kw: Any) -> Any:
        return await self.call(lambda: fetched(self.sync_connection.exec_driver_sql(statement, parameters, **kw)))

    async def run_sync(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        return await self.call(lambda: fn(self.sync_connection, *args, **kw))

    async def execution_options(self, **options: Any) -> SqliteConnection:
        self.sync_connection.execution_options(**options)
        return self

    def get_execution_options(self) -> Any:
        return self.sync_connection.get_execution_options()

    @contextlib.asynccontextmanager
    async def begin_nested(self) -> AsyncIterator[Any]:
        """A SAVEPOINT: released when the block ends, rolled back (and the error raised) when it fails."""
        nested = await self.call(self.sync_connection.begin_nested)
        try:
            yield nested
        except BaseException:
            await self.call(nested.rollback)
            raise
        await self.call(nested.commit)


class SqliteReader:
    """What `Database.read()` yields on SQLite: each statement stands alone, on one of the reader threads, over that
    thread's own connection (no transaction: it sees every commit before it). Nothing is checked out or held
    between statements, so a caller cancelled mid-statement leaves nothing behind."""

    def __init__(self, threads: SqliteThreads) -> None:
        self._threads = threads
        self.dialect = threads.engine.dialect

    async def execute(self, statement: Any, parameters: Any = None, **kw: Any) -> Any:
        return await self._threads.reading(lambda c: fetched(c.execute(statement, parameters, **kw)))

    async def exec_driver_sql(self, statement: str, parameters: Any = None, **kw: Any) -> Any:
        return await self._threads.reading(lambda c: fetched(c.exec_driver_sql(statement, parameters, **kw)))

    async def run_sync(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        return await self._threads.reading(lambda c: fn(c, *args, **kw))


class SqliteThreads:
    """The engine, the writer thread and the reader threads of one SQLite database."""

    def __init__(self, url: sa.URL, *, echo: bool) -> None:
        self.engine = sa.create_engine(url.set(drivername="sqlite+pysqlite"), echo=echo, hide_parameters=True,
                                       pool_size=READERS + 2, max_overflow=READERS)
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="amux-db-write")
        self.readers = ThreadPoolExecutor(READERS, thread_name_prefix="amux-db-read")
        self._local = threading.local()  # each reader thread's connection
        self._reader_conns: list[sa.Connection] = []
        self._lock = threading.Lock()

    def _reader_conn(self) -> sa.Connection:
        """This reader thread's connection (opened on its first statement): no BEGIN, so no transaction."""
        conn: sa.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.engine.connect()
            conn.execution_options(sqlite_begin=None)
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    def _read(self, fn: Callable[[sa.Connection], T]) -> T:
        conn = self._reader_conn()
        try:
            return fn(conn)
        finally:
            conn.rollback()  # ends SQLAlchemy's own (autobegun) transaction; SQLite never began one

    async def reading(self, fn: Callable[[sa.Connection], T]) -> T:
        """Run `fn(connection)` on a reader thread, with its connection, and return what it returns."""
        return await asyncio.get_running_loop().run_in_executor(self.readers, self._read, fn)

    @staticmethod
    def start(executor: ThreadPoolExecutor, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Start `fn` on one of `executor`'s threads (with the caller's context variables: its request id)."""
        ctx = contextvars.copy_context()
        return asyncio.get_running_loop().run_in_executor(executor, ctx.run, fn)

    async def on(self, executor: ThreadPoolExecutor, fn: Callable[[], T]) -> T:
        """Run `fn` on one of `executor`'s threads and return what it returns."""
        return await self.start(executor, fn)

    def hop(self, executor: ThreadPoolExecutor) -> Callable[[Callable[[], Any]], asyncio.Future[Any]]:
        return lambda fn: self.start(executor, fn)

    def write_unit(self, body: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        """On the writer thread: BEGIN IMMEDIATE, the whole body, COMMIT (ROLLBACK when it fails)."""
        with self.engine.connect() as conn:
            conn.execution_options(sqlite_begin="BEGIN IMMEDIATE")  # the write lock before any read
            with conn.begin():
                return run_body(body(SqliteConnection(conn, None)))

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[SqliteConnection]:
        """A write transaction whose statements the caller awaits one at a time (each a hop to the writer)."""
        conn = self.engine.connect()  # from the pool, here: no statement runs
        wrapped = SqliteConnection(conn, self.hop(self.writer))
        try:
            conn.execution_options(sqlite_begin="BEGIN IMMEDIATE")
            trans = await wrapped.call(conn.begin)
            try:
                yield wrapped
            except BaseException:
                await asyncio.shield(wrapped.call(trans.rollback))
                raise
            await asyncio.shield(wrapped.call(trans.commit))
        finally:
            # A cancelled writer (shutdown, a client gone) must still end its transaction now: left to the garbage
            # collector, SQLite's write lock outlives it and the next writer waits `busy_timeout`. Back to the pool
            # here (its reset rolls back a transaction a failed commit left open).
            await asyncio.shield(wrapped.settle())
            conn.close()

    async def close(self) -> None:
        """Stop the threads (after what they run), then close every connection."""
        def stop() -> None:
            self.writer.shutdown(wait=True)
            self.readers.shutdown(wait=True)

        await asyncio.get_running_loop().run_in_executor(None, stop)
        for conn in self._reader_conns:
            conn.close()
        self.engine.dispose()
