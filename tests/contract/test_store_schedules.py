"""SqlScheduleStore: one test per rule its methods state — the same suite on SQLite and PostgreSQL."""
from __future__ import annotations

import asyncio

import pytest

from hub.store.db import Database
from hub.store.schedules import Binding, SqlScheduleStore, Visibility
from tests.contract import store_rows as r


@pytest.fixture
async def store(db: Database) -> SqlScheduleStore:
    """A store over a database holding alice (bindings in cli_a, cli_b and a revoked one) and bob."""
    async with db.write() as conn:
        await r.principal(conn, "p_alice", "alice")
        await r.principal(conn, "p_bob", "bob")
        await r.binding(conn, "ib_a", "p_alice", "cli_a")
        await r.binding(conn, "ib_b", "p_alice", "cli_b")
        await r.binding(conn, "ib_old", "p_alice", "cli_a", status="revoked")
    return SqlScheduleStore(db)


async def names(store: SqlScheduleStore, v: Visibility, **kw) -> list[str]:
    async with store.db.read() as conn:
        return [row.name for row in await store.visible(conn, v, limit=kw.pop("limit", None), **kw)]


async def test_insert_writes_the_columns_given_and_get_reads_them_back(store):
    async with store.db.write() as conn:
        await store.insert(conn, {"id": "sch_1", "creator_id": "p_alice", "provenance": {"source": "mcp"},
                                  "type": "subtask", "name": "nightly", "prompt": "say hi", "rule": "every 5m",
                                  "timezone": "UTC", "paused": False, "next_fire_at": r.at(5), "model": "m-1",
                                  "extra_args": ["--x"], "created_at": r.T0, "updated_at": r.T0})
    async with store.db.read() as conn:
        row = await store.get(conn, "sch_1", Visibility(creator_id=None))
    assert (row.name, row.model, row.extra_args, row.provenance) == ("nightly", "m-1", ["--x"], {"source": "mcp"})
    assert r.utc(row.next_fire_at) == r.at(5) and row.notify == "failures"   # an omitted column takes its default


async def test_get_returns_none_for_a_schedule_the_visibility_does_not_admit(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "sch_1", "p_alice")
    async with store.db.read() as conn:
        assert (await store.get(conn, "sch_1", Visibility(creator_id="p_alice"))).id == "sch_1"
        assert await store.get(conn, "sch_1", Visibility(creator_id="p_bob")) is None
        assert await store.get(conn, "sch_nope", Visibility(creator_id=None)) is None


async def test_get_with_lock_holds_the_row_until_the_transaction_ends(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "sch_1", "p_alice")

    async def other_writer() -> None:
        async with store.db.write() as conn:
            await store.update(conn, "sch_1", {"name": "renamed"})

    async with store.db.write() as conn:
        assert await store.get(conn, "sch_1", Visibility(creator_id=None), lock=True) is not None
        writer = asyncio.create_task(other_writer())
        done, _ = await asyncio.wait({writer}, timeout=0.5)
        assert not done  # the other writer waits for the lock
    await asyncio.wait_for(writer, 10)
    async with store.db.read() as conn:
        assert (await store.get(conn, "sch_1", Visibility(creator_id=None))).name == "renamed"


async def test_update_writes_only_the_given_columns(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "sch_1", "p_alice", model="m-1")
        await store.update(conn, "sch_1", {"paused": True, "updated_at": r.at(1)})
    async with store.db.read() as conn:
        row = await store.get(conn, "sch_1", Visibility(creator_id=None))
    assert (row.paused, row.model, row.name, r.utc(row.updated_at)) == (True, "m-1", "sch_1", r.at(1))


async def test_mark_deleted_stops_firing_and_keeps_the_row_and_its_firings(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "sch_1", "p_alice")
        await r.firing(conn, "fir_1", "sch_1", 5, admission="ok")
        await store.mark_deleted(conn, "sch_1", r.at(7))
    async with store.db.read() as conn:
        assert await store.get(conn, "sch_1", Visibility(creator_id=None)) is None
        row = await store.get(conn, "sch_1", Visibility(creator_id=None, include_deleted=True))
    assert (r.utc(row.deleted_at), row.next_fire_at, r.utc(row.updated_at)) == (r.at(7), None, r.at(7))


async def test_visible_lists_newest_first_with_ties_by_id_and_the_creator_name(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "sch_b", "p_alice", created=1)
        await r.schedule(conn, "sch_a", "p_alice", created=1)
        await r.schedule(conn, "sch_old", "p_alice", created=0)
        await r.schedule(conn, "sch_new", "p_bob", created=2)
    async with store.db.read() as conn:
        rows = await store.visible(conn, Visibility(creator_id=None), limit=None)
    assert [(x.id, x.creator_name) for x in rows] == [("sch_new", "bob"), ("sch_a", "alice"), ("sch_b", "alice"),
                                                      ("sch_old", "alice")]
    assert await names(store, Visibility(creator_id=None), limit=2, offset=1) == ["sch_a", "sch_b"]


async def test_count_visible_counts_what_the_visibility_admits(store):
    async with store.db.write() as conn:
        for i in range(3):
            await r.schedule(conn, f"sch_{i}", "p_alice")
        await r.schedule(conn, "sch_bob", "p_bob")
    async with store.db.read() as conn:
        assert await store.count_visible(conn, Visibility(creator_id="p_alice")) == 3
        assert await store.count_visible(conn, Visibility(creator_id=None)) == 4
        assert await store.count_visible(conn, Visibility(creator_id="p_alice", nothing=True)) == 0


@pytest.mark.parametrize("v, expected", [
    # the frozen creator only
    (Visibility(creator_id="p_alice"), {"frozen_a", "frozen_b", "unattributed", "old_binding"}),
    # any creator's (an admin asking for everyone's)
    (Visibility(creator_id=None), {"frozen_a", "frozen_b", "unattributed", "old_binding", "bobs"}),
    # an application: only those frozen to it (none attributed to no application)
    (Visibility(creator_id="p_alice", app_id="cli_a"), {"frozen_a", "old_binding"}),
    # creator bindings: only one of these (none without a binding)
    (Visibility(creator_id="p_alice", app_id="cli_a", creator_bindings=frozenset({"ib_a", "ib_b"})),
     {"frozen_a"}),
    # nothing at all
    (Visibility(creator_id=None, nothing=True), set()),
    # deleted ones only when asked
    (Visibility(creator_id="p_bob", include_deleted=True), {"bobs", "bobs_deleted"}),
])
async def test_every_visibility_field_narrows_the_schedules_admitted(store, v, expected):
    async with store.db.write() as conn:
        await r.schedule(conn, "frozen_a", "p_alice", app_id="cli_a", creator_binding_id="ib_a")
        await r.schedule(conn, "frozen_b", "p_alice", app_id="cli_b", creator_binding_id="ib_b")
        await r.schedule(conn, "unattributed", "p_alice")
        await r.schedule(conn, "old_binding", "p_alice", app_id="cli_a", creator_binding_id="ib_old")
        await r.schedule(conn, "bobs", "p_bob")
        await r.schedule(conn, "bobs_deleted", "p_bob", deleted_at=r.at(1))
    assert set(await names(store, v)) == expected


async def test_creator_name_is_the_principals_name_or_none_without_a_creator(store):
    async with store.db.read() as conn:
        assert await store.creator_name(conn, "p_alice") == "alice"
        assert await store.creator_name(conn, None) is None


async def test_active_bindings_are_the_principals_active_ones_in_every_application_in_id_order(store):
    async with store.db.read() as conn:
        assert await store.active_bindings(conn, "p_alice") == [Binding("ib_a", "p_alice", "cli_a", "active"),
                                                                 Binding("ib_b", "p_alice", "cli_b", "active")]
        assert await store.active_bindings(conn, "p_bob") == []


async def test_binding_is_returned_whatever_its_status(store):
    async with store.db.read() as conn:
        assert await store.binding(conn, "ib_old") == Binding("ib_old", "p_alice", "cli_a", "revoked")
        assert await store.binding(conn, "ib_nope") is None


async def test_active_binding_of_a_feishu_user_is_none_when_revoked_or_unknown(store):
    async with store.db.read() as conn:
        assert (await store.active_binding_of(conn, "cli_a", "ou_ib_a")).id == "ib_a"
        assert await store.active_binding_of(conn, "cli_a", "ou_ib_old") is None
        assert await store.active_binding_of(conn, "cli_b", "ou_ib_a") is None  # another application's user


async def test_turn_receipt_is_the_receipt_frozen_in_the_turns_snapshot_or_empty(store):
    async with store.db.write() as conn:
        await r.task(conn, "tr_turn", "p_alice", "running",
                     snapshot={"receipt": {"source": "feishu", "app_id": "cli_a"}})
        await r.task(conn, "tr_plain", "p_alice", "running")
    async with store.db.read() as conn:
        assert await store.turn_receipt(conn, "tr_turn") == {"source": "feishu", "app_id": "cli_a"}
        assert await store.turn_receipt(conn, "tr_plain") == {}
        assert await store.turn_receipt(conn, "tr_gone") == {}


async def test_task_result_text_is_none_while_the_task_has_none(store):
    async with store.db.write() as conn:
        await r.task(conn, "tr_done", "p_alice", "succeeded", result_text="all good")
        await r.task(conn, "tr_open", "p_alice", "running")
    async with store.db.read() as conn:
        assert await store.task_result_text(conn, "tr_done") == "all good"
        assert await store.task_result_text(conn, "tr_open") is None


async def test_active_incident_count_counts_only_the_applications_active_incidents(store):
    async with store.db.write() as conn:
        for sid in ("s1", "s2", "s3", "s4"):
            await r.schedule(conn, sid, "p_alice")
        await r.incident(conn, "inc_1", "s1", "cli_a")
        await r.incident(conn, "inc_2", "s2", "cli_a")
        await r.incident(conn, "inc_3", "s3", "cli_a", active=False)
        await r.incident(conn, "inc_4", "s4", "cli_b")
    async with store.db.read() as conn:
        assert await store.active_incident_count(conn, "cli_a") == 2
        assert await store.active_incident_count(conn, "cli_none") == 0
