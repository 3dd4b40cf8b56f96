"""SqlFiringStore: one test per rule its methods state — the same suite on SQLite and PostgreSQL."""
from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from hub.store.db import Database
from hub.store.firings import Creator, DispatchResult, NewFiring, SqlFiringStore
from hub.store.tables import firings, schedules
from tests.contract import store_rows as r


@pytest.fixture
async def store(db: Database) -> SqlFiringStore:
    """A store over a database holding alice and bob."""
    async with db.write() as conn:
        await r.principal(conn, "p_alice", "alice")
        await r.principal(conn, "p_bob", "bob")
    return SqlFiringStore(db)


async def firing_row(store: SqlFiringStore, fid: str):
    async with store.db.read() as conn:
        return (await conn.execute(sa.select(firings).where(firings.c.id == fid))).first()


async def next_fire(store: SqlFiringStore, sid: str):
    async with store.db.read() as conn:
        return r.utc((await conn.execute(sa.select(schedules.c.next_fire_at).where(schedules.c.id == sid))).scalar())


# ------------------------------------------------------------ claim and persist

async def test_claim_due_takes_up_to_limit_due_schedules_soonest_first_never_paused_or_deleted(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s_late", "p_alice", next_fire_at=r.at(3))
        await r.schedule(conn, "s_soon", "p_alice", next_fire_at=r.at(1))
        await r.schedule(conn, "s_mid", "p_alice", next_fire_at=r.at(2))
        await r.schedule(conn, "s_future", "p_alice", next_fire_at=r.at(60))
        await r.schedule(conn, "s_paused", "p_alice", next_fire_at=r.at(0), paused=True)
        await r.schedule(conn, "s_deleted", "p_alice", next_fire_at=r.at(0), deleted_at=r.at(0))
        await r.schedule(conn, "s_consumed", "p_alice", next_fire_at=None)
    async with store.db.write() as conn:
        assert [x.id for x in await store.claim_due(conn, r.at(10), 2)] == ["s_soon", "s_mid"]
        assert [x.id for x in await store.claim_due(conn, r.at(10), 10)] == ["s_soon", "s_mid", "s_late"]


async def test_claim_due_skips_schedules_another_claimer_holds(store, db_url):
    async with store.db.write() as conn:
        for i in range(5):
            await r.schedule(conn, f"s{i}", "p_alice", next_fire_at=r.at(i))
    other = SqlFiringStore(Database(db_url))  # another replica
    first_claimed, second_done = asyncio.Event(), asyncio.Event()
    held_until_second_done = False

    async def first() -> list[str]:
        nonlocal held_until_second_done
        async with store.db.write() as conn:
            rows = await store.claim_due(conn, r.at(10), 3)
            await store.advance(conn, [(x.id, r.at(100)) for x in rows])
            first_claimed.set()
            # PostgreSQL: the other replica claims while this claim is held; SQLite: it waits for the one writer.
            held_until_second_done = await _within(second_done, 0.5)
        return [x.id for x in rows]

    async def second() -> list[str]:
        await first_claimed.wait()
        async with other.db.write() as conn:
            rows = await other.claim_due(conn, r.at(10), 10)
            await other.advance(conn, [(x.id, r.at(100)) for x in rows])
        second_done.set()
        return [x.id for x in rows]

    try:
        a, b = await asyncio.gather(first(), second())
    finally:
        await other.db.close()
    assert a == ["s0", "s1", "s2"] and b == ["s3", "s4"]
    assert held_until_second_done is not store.db.is_sqlite  # skipped, not waited for, where rows are locked


async def _within(event: asyncio.Event, timeout: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), timeout)
        return True
    except asyncio.TimeoutError:
        return False


async def test_latest_is_the_firing_with_the_latest_nominal_time(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.schedule(conn, "s2", "p_alice")
        await r.firing(conn, "f_new", "s1", 10)
        await r.firing(conn, "f_old", "s1", 5)
        await r.firing(conn, "f_other", "s2", 20)
    async with store.db.read() as conn:
        assert (await store.latest(conn, "s1")).id == "f_new"
        assert await store.latest(conn, "s_none") is None


async def test_insert_refuses_a_second_firing_for_the_same_schedule_and_nominal_time(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await store.insert(conn, [NewFiring(id="f1", schedule_id="s1", nominal_time=r.at(5), fired_at=r.at(5)),
                                  NewFiring(id="f2", schedule_id="s1", nominal_time=r.at(10), fired_at=r.at(10),
                                            admission="missed", outcome="missed", missed_count=3,
                                            reconciled_at=r.at(10))])
    with pytest.raises(sa.exc.IntegrityError):
        async with store.db.write() as conn:
            await store.insert(conn, [NewFiring(id="f3", schedule_id="s1", nominal_time=r.at(5), fired_at=r.at(6))])
    f1, f2 = await firing_row(store, "f1"), await firing_row(store, "f2")
    assert (f1.admission, f1.reconciled_at, f1.legacy) == (None, None, False)
    assert (f2.admission, f2.outcome, f2.missed_count) == ("missed", "missed", 3)
    assert await firing_row(store, "f3") is None


async def test_extend_missed_sets_the_collapsed_count_and_reconciles_now(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.firing(conn, "f1", "s1", 5, admission="missed", outcome="missed", missed_count=1,
                       reconciled_at=r.at(6))
        await store.extend_missed(conn, "f1", 4, r.at(20))
    f = await firing_row(store, "f1")
    assert (f.missed_count, r.utc(f.reconciled_at), r.utc(f.nominal_time)) == (4, r.at(20), r.at(5))


async def test_advance_sets_each_schedules_next_fire_time(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.schedule(conn, "s2", "p_alice")
        await r.schedule(conn, "s3", "p_alice")
        await store.advance(conn, [("s1", r.at(10)), ("s2", None)])
    assert (await next_fire(store, "s1"), await next_fire(store, "s2"), await next_fire(store, "s3")) == (
        r.at(10), None, r.at(5))


async def test_next_fire_at_is_the_soonest_of_schedules_neither_paused_nor_deleted(store):
    async with store.db.read() as conn:
        assert await store.next_fire_at(conn) is None
    async with store.db.write() as conn:
        await r.schedule(conn, "s_paused", "p_alice", next_fire_at=r.at(1), paused=True)
        await r.schedule(conn, "s_deleted", "p_alice", next_fire_at=r.at(2), deleted_at=r.at(0))
        await r.schedule(conn, "s_next", "p_alice", next_fire_at=r.at(3))
        await r.schedule(conn, "s_later", "p_alice", next_fire_at=r.at(4))
    async with store.db.read() as conn:
        assert r.utc(await store.next_fire_at(conn)) == r.at(3)


# ------------------------------------------------------------ dispatch

async def test_creators_are_principals_that_still_exist_and_say_whether_they_hold_a_live_admin_token(store):
    async with store.db.write() as conn:
        await r.principal(conn, "p_root", "root")
        await r.token(conn, "p_root", admin=True)
        await r.token(conn, "p_bob", admin=True, revoked=True)  # a revoked admin token exempts nobody
        await r.token(conn, "p_alice")
    async with store.db.read() as conn:
        assert await store.creators(conn, {"p_alice", "p_bob", "p_root", "p_gone"}) == {
            "p_alice": Creator(name="alice", holds_admin=False), "p_bob": Creator(name="bob", holds_admin=False),
            "p_root": Creator(name="root", holds_admin=True)}
        assert await store.creators(conn, set()) == {}


async def test_online_runtimes_are_only_those_online_now(store):
    async with store.db.write() as conn:
        await r.runtime(conn, "rt_on", "p_alice")
        await r.runtime(conn, "rt_off", "p_alice", status="offline")
    async with store.db.read() as conn:
        rows = await store.online_runtimes(conn)
    assert [(x.name, x.capabilities) for x in rows] == [("rt_on", {"engines": ["scripted"]})]


async def test_claim_unrecorded_returns_only_firings_whose_dispatch_is_unrecorded_and_unreconciled(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.firing(conn, "f_open", "s1", 5)
        await r.firing(conn, "f_recorded", "s1", 10, admission="ok", task_id="tr_1")
        await r.firing(conn, "f_unknown", "s1", 15, outcome="unknown", reconciled_at=r.at(20))  # the reconciler's
    async with store.db.write() as conn:
        assert await store.claim_unrecorded(conn, ["f_open", "f_recorded", "f_unknown", "f_gone"]) == {"f_open"}
        assert await store.claim_unrecorded(conn, []) == set()


async def test_claim_unrecorded_skips_a_firing_the_reconciler_holds(store, db_url):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.firing(conn, "f_open", "s1", 5)
    other = SqlFiringStore(Database(db_url))
    held, recorded = asyncio.Event(), asyncio.Event()
    held_until_recorded = False

    async def reconciler() -> None:
        nonlocal held_until_recorded
        async with store.db.write() as conn:
            [row] = await store.claim_never_recorded(conn, r.at(60))
            held.set()
            held_until_recorded = await _within(recorded, 0.5)
            assert await store.settle(conn, row.id, "unknown", r.at(60))

    async def dispatch() -> set[str]:
        await held.wait()
        async with other.db.write() as conn:
            got = await other.claim_unrecorded(conn, ["f_open"])
        recorded.set()
        return got

    try:
        _, got = await asyncio.gather(reconciler(), dispatch())
    finally:
        await other.db.close()
    assert got == set()  # skipped while held (PostgreSQL) or reconciled by then (SQLite's one writer)
    assert held_until_recorded is not store.db.is_sqlite
    assert (await firing_row(store, "f_open")).outcome == "unknown"


async def test_record_writes_admission_correlation_and_reconciled_at_as_given(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice", type="session-prompt")
        for i, fid in enumerate(("f_task", "f_turn", "f_off")):
            await r.firing(conn, fid, "s1", 5 * (i + 1))
        await store.record(conn, [
            DispatchResult(firing_id="f_task", admission="ok", task_id="tr_1"),
            DispatchResult(firing_id="f_turn", admission="ok", turn_id="turn_1"),
            DispatchResult(firing_id="f_off", admission="skipped:offline", reconciled_at=r.at(16))])
    t, u, o = [await firing_row(store, f) for f in ("f_task", "f_turn", "f_off")]
    assert (t.admission, t.task_id, t.turn_id, t.reconciled_at) == ("ok", "tr_1", None, None)
    assert (u.admission, u.task_id, u.turn_id, u.reconciled_at) == ("ok", None, "turn_1", None)
    assert (o.admission, o.task_id, r.utc(o.reconciled_at)) == ("skipped:offline", None, r.at(16))


# ------------------------------------------------------------ reconcile

async def test_claim_finished_tasks_returns_unreconciled_firings_whose_task_is_terminal_or_gone(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice", app_id="cli_a", rule="at 2026-01-05T09:05:00Z")
        for i, status in enumerate(("succeeded", "failed", "cancelled", "timed_out", "queued", "running")):
            await r.task(conn, f"tr_{status}", "p_alice", status)
            await r.firing(conn, f"f_{status}", "s1", i, admission="ok", task_id=f"tr_{status}")
        await r.firing(conn, "f_vanished", "s1", 10, admission="ok", task_id="tr_vanished")
        await r.task(conn, "tr_settled", "p_alice", "failed")
        await r.firing(conn, "f_settled", "s1", 11, admission="ok", task_id="tr_settled", outcome="failed",
                       reconciled_at=r.at(12))
    async with store.db.write() as conn:
        rows = {x.id: x for x in await store.claim_finished_tasks(conn)}
    assert set(rows) == {"f_succeeded", "f_failed", "f_cancelled", "f_timed_out", "f_vanished"}
    assert rows["f_vanished"].status is None and rows["f_failed"].status == "failed"
    x = rows["f_failed"]
    assert (x.schedule_id, x.creator_id, x.app_id, x.type, x.rule, x.task_id) == (
        "s1", "p_alice", "cli_a", "subtask", "at 2026-01-05T09:05:00Z", "tr_failed")


async def test_claim_never_recorded_returns_unrecorded_firings_fired_before_the_cutoff(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.firing(conn, "f_old", "s1", 0)
        await r.firing(conn, "f_recent", "s1", 9)
        await r.firing(conn, "f_recorded", "s1", 1, admission="ok", task_id="tr_x")
        await r.firing(conn, "f_missed", "s1", 2, admission="missed", outcome="missed", reconciled_at=r.at(2))
    async with store.db.write() as conn:
        assert [x.id for x in await store.claim_never_recorded(conn, r.at(5))] == ["f_old"]


async def test_open_turns_are_unreconciled_firings_that_delivered_a_turn(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice", type="session-prompt", session_ref="ses_1")
        await r.firing(conn, "f_open", "s1", 0, admission="ok", turn_id="turn_1")
        await r.firing(conn, "f_done", "s1", 5, admission="ok", turn_id="turn_2", outcome="failed",
                       reconciled_at=r.at(6))
        await r.firing(conn, "f_task", "s1", 10, admission="ok", task_id="tr_1")
    async with store.db.read() as conn:
        rows = await store.open_turns(conn)
    assert [(x.id, x.turn_id, x.type) for x in rows] == [("f_open", "turn_1", "session-prompt")]


async def test_settle_reconciles_a_firing_once(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.firing(conn, "f1", "s1", 0, admission="ok", turn_id="turn_1")
        assert await store.settle(conn, "f1", "succeeded", r.at(3)) is True
        assert await store.settle(conn, "f1", "failed", r.at(4)) is False
    f = await firing_row(store, "f1")
    assert (f.outcome, r.utc(f.reconciled_at)) == ("succeeded", r.at(3))


# ------------------------------------------------------------ reads

async def test_history_is_newest_first_with_uncorrelated_legacy_records_unconfirmed_and_correlated_ones_left_out(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.firing(conn, "f_new", "s1", 30, admission="ok", task_id="tr_two", outcome="succeeded",
                       reconciled_at=r.at(31))
        await r.firing(conn, "f_old", "s1", 20, admission="ok", task_id="tr_one")
        await r.legacy(conn, "leg_dup", "s1", 19, "tr_one")      # the same Task as ledger firing f_old
        await r.legacy(conn, "leg_task", "s1", 10, "tr_zero")
        await r.legacy(conn, "leg_none", "s1", 5, None)
    async with store.db.read() as conn:
        page = await store.history(conn, "s1", offset=0, limit=10)
        tail = await store.history(conn, "s1", offset=2, limit=1)
    assert [x.id for x in page] == ["f_new", "f_old", "leg_task", "leg_none"]
    assert [(x.legacy, x.outcome, x.admission) for x in page] == [
        (False, "succeeded", "ok"), (False, None, "ok"), (True, "unconfirmed", "ok"), (True, "unconfirmed", None)]
    assert [x.id for x in tail] == ["leg_task"]


async def test_recent_is_the_latest_firings_of_these_schedules_together(store):
    async with store.db.write() as conn:
        for sid in ("s1", "s2", "s3"):
            await r.schedule(conn, sid, "p_alice")
        await r.firing(conn, "f1", "s1", 1)
        await r.firing(conn, "f2", "s2", 2)
        await r.firing(conn, "f3", "s1", 3)
        await r.firing(conn, "f4", "s3", 4)
    async with store.db.read() as conn:
        assert [x.id for x in await store.recent(conn, ["s1", "s2"], 2)] == ["f3", "f2"]
        assert await store.recent(conn, [], 5) == []


async def test_count_and_nth_with_task_see_only_firings_that_admitted_a_task(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.firing(conn, "f_a", "s1", 1, admission="ok", task_id="tr_a")
        await r.firing(conn, "f_off", "s1", 2, admission="skipped:offline")
        await r.firing(conn, "f_b", "s1", 3, admission="ok", task_id="tr_b")
    async with store.db.read() as conn:
        assert await store.count_with_task(conn, "s1") == 2
        assert [(await store.nth_with_task(conn, "s1", i)).id for i in (0, 1)] == ["f_b", "f_a"]
        assert await store.nth_with_task(conn, "s1", 2) is None
