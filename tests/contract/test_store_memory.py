"""SqlMemoryStore on SQLite and PostgreSQL: one test per rule its methods state."""
from __future__ import annotations

import pytest
import sqlalchemy as sa

from hub.clock import ManualClock, utc
from hub.store.db import Database
from hub.store.memory import SqlMemoryStore
from hub.store.tables import memory, principals, sessions
from tests.contract.task_rows import CAPS, runtime, task


@pytest.fixture
async def store(db: Database, clock: ManualClock) -> SqlMemoryStore:
    """A memory store over a database holding principal alice."""
    async with db.write() as conn:
        await conn.execute(principals.insert().values(id="alice", kind="user", name="alice", created_at=clock.now()))
    return SqlMemoryStore(db)


async def put(store: SqlMemoryStore, clock: ManualClock, scope: str, key: str, value: str) -> None:
    async with store.db.write() as conn:
        await store.put(conn, scope, key, value, clock.now())


async def test_a_sessions_scope_is_read_as_stored_and_none_without_the_session_or_a_scope(store, clock):
    async with store.db.write() as conn:
        for sid, scope in (("ses_pending", "pending:global"), ("ses_bound", "principal:alice"),
                           ("ses_none", "none"), ("ses_legacy", None)):
            await conn.execute(sessions.insert().values(
                id=sid, owner_id="alice", kind="child", source="cli", engine="scripted", snapshot={}, turns=0,
                memory_scope=scope, created_at=clock.now(), updated_at=clock.now()))
    async with store.db.read() as conn:
        assert await store.session_scope(conn, "ses_pending") == "pending:global"
        assert await store.session_scope(conn, "ses_bound") == "principal:alice"
        assert await store.session_scope(conn, "ses_none") == "none"
        assert await store.session_scope(conn, "ses_legacy") is None
        assert await store.session_scope(conn, "ses_missing") is None


async def test_a_key_in_another_scope_is_never_seen(store, clock):
    await put(store, clock, "global", "plan", "ship it")
    async with store.db.read() as conn:
        assert await store.get(conn, "global", "plan") == "ship it"
        assert await store.get(conn, "principal:alice", "plan") is None
        assert await store.get(conn, "global", "other") is None


async def test_put_creates_a_key_then_replaces_its_value_and_records_when(store, clock):
    await put(store, clock, "global", "plan", "draft")
    later = clock.advance(30)
    await put(store, clock, "global", "plan", "ship it")
    await put(store, clock, "principal:alice", "plan", "mine")
    async with store.db.read() as conn:
        rows = (await conn.execute(sa.select(memory).order_by(memory.c.scope))).all()
    assert [(r.scope, r.key, r.value) for r in rows] == [("global", "plan", "ship it"),
                                                         ("principal:alice", "plan", "mine")]
    assert utc(rows[0].updated_at) == later


async def test_delete_removes_the_key_from_its_scope_only_and_says_when_it_was_not_there(store, clock):
    await put(store, clock, "global", "plan", "a")
    await put(store, clock, "principal:alice", "plan", "b")
    async with store.db.write() as conn:
        assert await store.delete(conn, "global", "plan") is True
        assert await store.delete(conn, "global", "plan") is False
    async with store.db.read() as conn:
        assert await store.get(conn, "global", "plan") is None
        assert await store.get(conn, "principal:alice", "plan") == "b"


async def test_the_keys_of_a_scope_are_its_own_in_order(store, clock):
    for key in ("zeta", "alpha", "mid"):
        await put(store, clock, "global", key, "v")
    await put(store, clock, "principal:alice", "other", "v")
    async with store.db.read() as conn:
        assert await store.keys(conn, "global") == ["alpha", "mid", "zeta"]
        assert await store.keys(conn, "principal:nobody") == []


async def test_a_run_outside_a_session_has_memory_only_on_a_runtime_that_reported_the_capability(store, clock):
    async with store.db.write() as conn:
        able = await runtime(conn, "alice", name="able", caps={**CAPS, "memory_cli": True})
        bare = await runtime(conn, "alice", name="bare", caps=CAPS)  # reported nothing about memory
        off = await runtime(conn, "alice", name="off", caps={**CAPS, "memory_cli": False})
        runs = {name: await task(conn, "alice", status="running", runtime_id=rt)
                for name, rt in (("able", able), ("bare", bare), ("off", off))}
        runs["queued"] = await task(conn, "alice")
    async with store.db.read() as conn:
        assert await store.run_has_memory(conn, runs["able"])
        for name in ("bare", "off", "queued"):
            assert not await store.run_has_memory(conn, runs[name]), name
        assert not await store.run_has_memory(conn, "tr_missing")
