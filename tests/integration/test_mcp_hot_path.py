"""The database work of one MCP call on each store, counted statement by statement: a verified token is cached per
replica, a lease-gated call reads its task (and box) in one statement, and the activity clock moves at most once per
`leases.activity_granularity_s`."""
from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Iterator

import pytest
import sqlalchemy as sa

from hub.store.db import Database
from tests.helpers import HubHandle, mcp_client, start_hub
from tests.integration.test_box_escape import destroy_live_boxes


@pytest.fixture
async def quiet_hub(db_url, tmp_path, clock) -> AsyncIterator[HubHandle]:
    """A hub on a real port over each backend, without background loops (so every statement is the call's)."""
    handle = await start_hub(db_url, tmp_path, clock, background=False)
    yield handle
    await destroy_live_boxes(handle.hub)
    await handle.stop()


@contextlib.contextmanager
def statements(db: Database, *, control: bool = False) -> Iterator[list[str]]:
    """Record the SQL statements run through `db` while the block runs (transaction control too with `control`:
    SQLite's BEGIN is a statement; PostgreSQL's asyncpg begins without one)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        is_control = statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK", "RELEASE", "SAVEPOINT"))
        if control or not is_control:
            seen.append(" ".join(statement.split()))

    sa.event.listen(db.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(db.sync_engine, "before_cursor_execute", record)


async def ok(client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await client.call_tool(tool, args)
    assert not res.is_error, res.content[0].text
    return res.structured_content


async def test_a_verified_token_is_not_read_again_for_the_next_calls(quiet_hub):
    async with mcp_client(quiet_hub.url, await quiet_hub.token("alice"), name="Claude") as c:
        await ok(c, "profile_list", {})
        for _ in range(3):
            with statements(quiet_hub.hub.db, control=True) as seen:
                await ok(c, "profile_list", {})
            assert len(seen) == 1 and "FROM profiles" in seen[0], seen  # and no BEGIN: one autocommit read


async def test_rift_vm_list_is_one_statement_and_moves_the_activity_clock_at_most_once_a_minute(quiet_hub):
    async with mcp_client(quiet_hub.url, await quiet_hub.token("alice"), name="Claude") as c:
        task = await ok(c, "rift_task_new", {"name": "hot"})
        args = {"task": task["handle"]}
        await ok(c, "rift_vm_list", args)
        with statements(quiet_hub.hub.db) as seen:
            await ok(c, "rift_vm_list", args)
            await ok(c, "rift_vm_list", args)
        assert len(seen) == 2 and all(s.startswith("SELECT") and "lease_tasks" in s for s in seen), seen
        quiet_hub.clock.advance(seconds=quiet_hub.hub.settings.leases.activity_granularity_s)
        with statements(quiet_hub.hub.db) as seen:
            await ok(c, "rift_vm_list", args)
            await ok(c, "rift_vm_list", args)
        assert [s.split()[0] for s in seen] == ["SELECT", "UPDATE", "SELECT"], seen


async def test_rift_vm_exec_reads_its_task_and_box_in_one_statement(quiet_hub):
    async with mcp_client(quiet_hub.url, await quiet_hub.token("alice"), name="Claude") as c:
        task = await ok(c, "rift_task_new", {"name": "hot"})
        box = await ok(c, "rift_vm_new", {"task": task["handle"]})
        args = {"task": task["handle"], "vm_id": box["vm_id"], "command": "true"}
        await ok(c, "rift_vm_exec", args)
        with statements(quiet_hub.hub.db) as seen:
            assert (await ok(c, "rift_vm_exec", args))["exit_code"] == 0
        assert len(seen) == 1 and "lease_tasks" in seen[0] and "boxes" in seen[0], seen
        await ok(c, "rift_task_close", {"task": task["handle"]})


async def test_a_lease_another_replica_releases_or_takes_over_is_refused_on_the_very_next_call(quiet_hub):
    from hub.domain import leases as rules
    from hub.store.leases import SqlLeaseStore

    other = Database(quiet_hub.hub.settings.db_url())  # another replica's connections to the same database
    try:
        async with mcp_client(quiet_hub.url, await quiet_hub.token("alice"), name="Claude") as c:
            task = await ok(c, "rift_task_new", {"name": "hot"})
            await ok(c, "rift_vm_list", {"task": task["handle"]})
            async with other.write() as conn:
                await SqlLeaseStore(other).attach(conn, task["task_id"], secret_hash="0" * 64, holder_label="mcp:Codex",
                                                  holder_token_id="tok_other", now=quiet_hub.clock.now())
            res = await c.call_tool("rift_vm_list", {"task": task["handle"]})
            assert res.is_error and "mcp:Codex" in res.content[0].text, res.content[0].text
            mine = await ok(c, "rift_task_attach", {"task_id": task["task_id"], "takeover": True})
            await ok(c, "rift_vm_list", {"task": mine["handle"]})
            async with other.write() as conn:
                await SqlLeaseStore(other).release(conn, task["task_id"], quiet_hub.clock.now())
            res = await c.call_tool("rift_vm_list", {"task": mine["handle"]})
            assert res.is_error and rules.released(task["task_id"]) in res.content[0].text, res.content[0].text
    finally:
        await other.close()
