"""SqlRegistryStore, SqlReportStore and SqlDispatchStore: each rule their methods state, on SQLite and PostgreSQL
(lock rules on PostgreSQL, where they are row locks; SQLite's writers are serialized in-process)."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
import sqlalchemy as sa

from hub.clock import utc
from hub.store.db import Database
from hub.store.dispatch import ExpiredReservation, Placement, SqlDispatchStore
from hub.store.registry import RegistrationRace, SqlRegistryStore
from hub.store.reports import SqlReportStore
from hub.store.tables import mailbox, permission_replies, reservations, runtimes, sessions, task_runs
from tests.contract.task_rows import (CAPS, T0, principal, reservation, row, runtime, session, steer, task, token,
                                      waits)


@pytest.fixture
def registry(db: Database) -> SqlRegistryStore:
    """The registry store over each backend."""
    return SqlRegistryStore(db)


@pytest.fixture
def reports(db: Database) -> SqlReportStore:
    """The report store over each backend."""
    return SqlReportStore(db)


@pytest.fixture
def dispatch(db: Database) -> SqlDispatchStore:
    """The dispatch store over each backend."""
    return SqlDispatchStore(db)


# --- runtimes ---------------------------------------------------------------------------------------------------

async def test_list_all_returns_every_runtime_by_name_and_online_only_online_ones_by_id(db, registry, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        b = await runtime(conn, owner, name="b", status="offline")
        a = await runtime(conn, owner, name="a")
        c = await runtime(conn, owner, name="c", status="lost")
        d = await runtime(conn, owner, name="0")
        assert [r.id for r in await registry.list_all(conn)] == [d, a, b, c]
        assert [r.id for r in await dispatch.online(conn)] == sorted([a, d])


async def test_find_matches_a_runtime_by_id_or_by_name(db, registry):
    async with db.write() as conn:
        rt = await runtime(conn, await principal(conn), name="gpu-box")
        assert (await registry.find(conn, rt)).name == "gpu-box"
        assert (await registry.find(conn, "gpu-box")).id == rt
        assert await registry.find(conn, "nope") is None


async def test_by_name_returns_the_named_runtime_or_none(db, registry):
    async with db.write() as conn:
        rt = await runtime(conn, await principal(conn), name="box")
        assert (await registry.by_name(conn, "box")).id == rt
        assert (await registry.by_name(conn, "box", lock=True)).id == rt
        assert await registry.by_name(conn, "other") is None


async def test_name_of_a_runtime_comes_with_its_capabilities_and_an_unknown_one_is_none(db, registry):
    async with db.write() as conn:
        rt = await runtime(conn, await principal(conn), name="box")
        name, caps = await registry.name_of(conn, rt)
        assert name == "box" and isinstance(caps, dict)
        assert await registry.name_of(conn, "rt_gone") == (None, {})


async def test_reap_removes_runtimes_offline_since_before_the_cutoff_with_no_work_and_frees_their_names(db, registry):
    day = timedelta(days=1)
    async with db.write() as conn:
        owner = await principal(conn)
        gone = await runtime(conn, owner, name="pod-a", status="offline", last_seen=T0 - 2 * day)
        tid = await task(conn, owner, status="succeeded", runtime_id=gone, attempt=1)
        await reservation(conn, gone, tid, state="released")  # history of a finished run: no work
        busy = await runtime(conn, owner, name="pod-b", status="offline", last_seen=T0 - 2 * day)
        await reservation(conn, busy, await task(conn, owner, status="running", runtime_id=busy, attempt=1),
                          state="committed")
        await runtime(conn, owner, name="pod-c", status="offline", last_seen=T0 - timedelta(hours=1))  # recent
        await runtime(conn, owner, name="pod-d", status="online", last_seen=T0 - 2 * day)  # online: never
        assert await registry.reap(conn, T0 - day) == ["pod-a"]
        left = sorted((await conn.execute(sa.select(runtimes.c.name))).scalars())
        assert left == ["pod-b", "pod-c", "pod-d"]
        assert await registry.reap(conn, T0 - day) == []  # nothing more: a second replica's pass deletes nothing
        await runtime(conn, owner, name="pod-a")  # the name is free again


async def test_names_are_sorted_and_limited(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        for name in ("c", "a", "b"):
            await runtime(conn, owner, name=name)
        assert await registry.names(conn, 2) == ["a", "b"]


async def test_an_engine_is_offered_by_a_runtime_of_any_status(db, registry):
    async with db.write() as conn:
        await runtime(conn, await principal(conn), status="lost", caps={**CAPS, "engines": ["codex"]})
        assert await registry.engine_offered(conn, "codex")
        assert not await registry.engine_offered(conn, "claude")


async def test_platforms_offering_maps_every_runtime_of_any_status_offering_the_engine_to_its_platform(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        await runtime(conn, owner, name="win", status="offline", caps={**CAPS, "platform": "windows"})
        await runtime(conn, owner, name="mac", status="lost", caps={**CAPS, "platform": "darwin"})
        await runtime(conn, owner, name="bare", caps={"engines": ["scripted"]})
        await runtime(conn, owner, name="other", caps={**CAPS, "engines": ["codex"]})
        assert await registry.platforms_offering(conn, "scripted") == {"win": "windows", "mac": "darwin", "bare": None}
        assert await registry.platforms_offering(conn, "claude") == {}


async def test_owner_name_says_who_holds_a_runtime(db, registry):
    async with db.write() as conn:
        owner = await principal(conn, "alice")
        assert await registry.owner_name(conn, owner) == "alice"


async def test_register_inserts_a_new_runtime_online_and_updates_a_known_one_under_its_id(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await registry.register(conn, runtime_id=None, name="box", principal_id=owner, capabilities=CAPS, slots=2,
                                  shared=False, connection_id="conn_a", now=T0)
        await conn.execute(runtimes.update().where(runtimes.c.id == rt).values(status="offline", connection_id=None))
        later = T0 + timedelta(minutes=1)
        assert await registry.register(conn, runtime_id=rt, name="box", principal_id=owner,
                                       capabilities={**CAPS, "x": 1}, slots=5, shared=True, connection_id="conn_b",
                                       now=later) == rt
    r = await row(db, runtimes, rt)
    assert (r.status, r.connection_id, r.slots, r.shared, r.capabilities["x"]) == ("online", "conn_b", 5, True, 1)
    assert utc(r.last_seen_at) == later and utc(r.registered_at) == T0


async def test_a_second_first_registration_of_one_name_raises_registration_race(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        await registry.register(conn, runtime_id=None, name="box", principal_id=owner, capabilities=CAPS, slots=1,
                             shared=False, connection_id="conn_a", now=T0)
    with pytest.raises(RegistrationRace):
        async with db.write() as conn:
            await registry.register(conn, runtime_id=None, name="box", principal_id=owner, capabilities=CAPS, slots=1,
                                 shared=False, connection_id="conn_b", now=T0)


async def test_heartbeat_counts_only_on_the_current_connection(db, registry):
    async with db.write() as conn:
        rt = await runtime(conn, await principal(conn), status="offline", connection_id="conn_new")
        await registry.heartbeat(conn, rt, "conn_old", T0 + timedelta(minutes=5))
        assert (await registry.find(conn, rt)).status == "offline"
        await registry.heartbeat(conn, rt, "conn_new", T0 + timedelta(minutes=5))
    r = await row(db, runtimes, rt)
    assert r.status == "online" and utc(r.last_seen_at) == T0 + timedelta(minutes=5)


async def test_mark_offline_applies_only_while_the_connection_is_current(db, registry):
    async with db.write() as conn:
        rt = await runtime(conn, await principal(conn), connection_id="conn_new")
        await registry.mark_offline(conn, rt, "conn_old")
        assert await registry.connection(conn, rt) == ("conn_new", CAPS)
        await registry.mark_offline(conn, rt, "conn_new")
        assert await registry.connection(conn, rt) == (None, CAPS)
    assert (await row(db, runtimes, rt)).status == "offline"


async def test_open_reservations_count_every_reservation_not_released(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        for state in ("pending", "committed", "released"):
            await reservation(conn, rt, await task(conn, owner), state=state)
        assert await registry.open_reservations(conn, rt) == 2


async def test_delete_frees_the_name_with_the_runtimes_reservations(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner, name="box")
        await reservation(conn, rt, await task(conn, owner), state="released")
        await registry.delete(conn, rt)
        assert await registry.by_name(conn, "box") is None
        assert (await conn.execute(sa.select(sa.func.count()).select_from(reservations))).scalar() == 0


async def test_count_by_status_counts_runtimes_per_status(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        for status in ("online", "online", "lost"):
            await runtime(conn, owner, status=status)
        assert await registry.count_by_status(conn) == {"online": 2, "lost": 1}


# --- runs a runtime holds ------------------------------------------------------------------------------------------

async def test_runs_on_a_runtime_are_its_dispatched_and_running_ones(db, reports, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        rt, other = await runtime(conn, owner), await runtime(conn, owner)
        a = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1)
        b = await task(conn, owner, status="running", runtime_id=rt, attempt=2)
        await task(conn, owner, status="succeeded", runtime_id=rt, attempt=1)
        await task(conn, owner, status="running", runtime_id=other, attempt=1)
        assert sorted((r.id, r.status, r.attempt) for r in await reports.runs_on(conn, rt)) == [
            (a, "dispatched", 1), (b, "running", 2)]
        assert sorted(await dispatch.active_run_ids(conn, rt)) == [a, b]


async def test_placement_of_says_where_a_run_is(db, reports):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        tid = await task(conn, owner, status="running", runtime_id=rt, attempt=3)
        assert tuple(await reports.placement_of(conn, tid)) == (rt, 3, "running", None)  # and its error
        assert await reports.placement_of(conn, "tr_nope") is None


async def test_anything_to_reap_sees_an_expired_reservation_a_silent_runtime_an_overdue_run_or_an_old_queued_one(
        db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner, last_seen=T0)
        await task(conn, owner, created_at=T0)
        running = await task(conn, owner, status="running", runtime_id=rt, deadline_at=T0 + timedelta(hours=1))
        await reservation(conn, rt, running, expires_at=T0 + timedelta(minutes=1))
    now, before = T0 + timedelta(seconds=30), T0 - timedelta(seconds=1)
    assert not await dispatch.anything_to_reap(now, lost_before=before, overdue_before=now, queued_before=before)
    assert await dispatch.anything_to_reap(T0 + timedelta(minutes=2), lost_before=before, overdue_before=now,
                                        queued_before=before)  # the reservation's TTL passed
    assert await dispatch.anything_to_reap(now, lost_before=T0 + timedelta(seconds=1), overdue_before=now,
                                        queued_before=before)  # the runtime went silent
    assert await dispatch.anything_to_reap(now, lost_before=before, overdue_before=T0 + timedelta(hours=2),
                                        queued_before=before)  # the run is overdue
    assert await dispatch.anything_to_reap(now, lost_before=before, overdue_before=now,
                                        queued_before=T0 + timedelta(seconds=1))  # queued long enough to check


async def test_held_runs_return_each_existing_run_by_id_whoever_holds_it(db, reports):
    async with db.write() as conn:
        owner = await principal(conn)
        rt, other = await runtime(conn, owner), await runtime(conn, owner)
        mine = await task(conn, owner, status="running", runtime_id=rt, attempt=2)
        theirs = await task(conn, owner, status="running", runtime_id=other, attempt=1)
        rows = await reports.held_runs(conn, [theirs, mine, "tr_nope", mine])
        assert {k: (r.runtime_id, r.attempt) for k, r in rows.items()} == {mine: (rt, 2), theirs: (other, 1)}
        assert await reports.held_runs(conn, []) == {}


async def test_held_run_is_none_unless_this_runtime_holds_this_attempt(db, reports):
    async with db.write() as conn:
        owner = await principal(conn)
        rt, other = await runtime(conn, owner), await runtime(conn, owner)
        tid = await task(conn, owner, status="running", runtime_id=rt, attempt=2)
        assert (await reports.held_run(conn, rt, tid, 2)).id == tid
        assert await reports.held_run(conn, rt, tid, 1) is None
        assert await reports.held_run(conn, other, tid, 2) is None
        assert await reports.held_run(conn, rt, "tr_nope", 2) is None


async def test_resend_dispatch_forgets_only_a_pending_reservations_sending(db, reports):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        tid = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1)
        old = await reservation(conn, rt, tid, state="released", sent_at=T0)
        new = await reservation(conn, rt, tid, state="pending", sent_at=T0)
        await reports.resend_dispatch(conn, tid)
    assert (await row(db, reservations, new)).sent_at is None
    assert (await row(db, reservations, old)).sent_at is not None


async def test_start_run_marks_the_run_running_and_commits_only_its_attempts_pending_reservation(db, reports):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        tid = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=2)
        stale = await reservation(conn, rt, tid, attempt=1, state="released")
        mine = await reservation(conn, rt, tid, attempt=2)
        await reports.start_run(conn, tid, 2, T0)
    r = await row(db, task_runs, tid)
    assert r.status == "running" and utc(r.started_at) == T0
    assert (await row(db, reservations, mine)).state == "committed"
    assert (await row(db, reservations, stale)).state == "released"


# --- what a connection sends ---------------------------------------------------------------------------------------

async def test_a_runner_token_is_live_only_while_it_exists_unrevoked(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        live, revoked = await token(conn, owner), await token(conn, owner, revoked=True)
        assert await registry.runner_token_live(conn, live)
        assert not await registry.runner_token_live(conn, revoked)
        assert not await registry.runner_token_live(conn, "tok_gone")


async def test_claim_dispatches_returns_unsent_pending_dispatches_once(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        rt, other = await runtime(conn, owner), await runtime(conn, owner)
        tid = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1)
        res = await reservation(conn, rt, tid)
        sent = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1)
        await reservation(conn, rt, sent, sent_at=T0)
        gone = await task(conn, owner, status="cancelled", runtime_id=rt, attempt=1)
        await reservation(conn, rt, gone)
        await reservation(conn, other, await task(conn, owner, status="dispatched", runtime_id=other, attempt=1))
        claimed = await dispatch.claim_dispatches(conn, [rt], T0)
        assert [(r.id, r.task_id, r.attempt, r.owner_id, r.prompt) for r in claimed] == [(res, tid, 1, owner, "say hi")]
        assert await dispatch.claim_dispatches(conn, [rt], T0) == []
    assert utc((await row(db, reservations, res)).sent_at) == T0


async def test_claimable_says_whether_a_claim_would_return_a_dispatch_an_answer_or_a_steer(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        rt, other = await runtime(conn, owner), await runtime(conn, owner)
        sent = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1)
        await reservation(conn, rt, sent, sent_at=T0)
        await reservation(conn, rt, await task(conn, owner, status="cancelled", runtime_id=rt, attempt=1))
        running = await task(conn, owner, status="running", runtime_id=rt)
        await steer(conn, owner, running, state="delivered")
        await task(conn, owner, status="running", runtime_id=rt, cancel_requested_at=T0)  # a cancel: not claimed
        assert not await dispatch.claimable(conn, [rt, other])
        await steer(conn, owner, running)
        assert await dispatch.claimable(conn, [rt]) and not await dispatch.claimable(conn, [other])
        await dispatch.claim_steers(conn, [rt], T0)
        assert not await dispatch.claimable(conn, [rt])
        await conn.execute(permission_replies.insert().values(task_id=running, request_id="Bash", allow=True,
                                                              message="ok", created_at=T0))
        assert await dispatch.claimable(conn, [rt])
        await dispatch.claim_permission_answers(conn, [rt], T0)
        assert not await dispatch.claimable(conn, [rt])
        await reservation(conn, rt, await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1))
        assert await dispatch.claimable(conn, [rt])
        await dispatch.claim_dispatches(conn, [rt], T0)
        assert not await dispatch.claimable(conn, [rt])


async def test_cancels_due_are_the_running_runs_whose_cancellation_was_requested(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        asked = await task(conn, owner, status="running", runtime_id=rt, cancel_requested_at=T0)
        await task(conn, owner, status="running", runtime_id=rt)
        await task(conn, owner, status="cancelled", runtime_id=rt, cancel_requested_at=T0)
        assert [c.task_id for c in await dispatch.cancels_due(conn, [rt])] == [asked]


async def test_claim_permission_answers_returns_unsent_answers_for_running_runs_once(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        tid = await task(conn, owner, status="running", runtime_id=rt)
        done = await task(conn, owner, status="failed", runtime_id=rt)
        for t in (tid, done):
            await conn.execute(permission_replies.insert().values(task_id=t, request_id="Bash", allow=True,
                                                                  message="ok", created_at=T0))
        claimed = await dispatch.claim_permission_answers(conn, [rt], T0)
        assert [(a.task_id, a.request_id, a.allow, a.message) for a in claimed] == [(tid, "Bash", True, "ok")]
        assert await dispatch.claim_permission_answers(conn, [rt], T0) == []


async def test_claim_steers_returns_pending_unsent_steers_for_the_runtimes_runs_once(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        rt, other = await runtime(conn, owner), await runtime(conn, owner)
        tid = await task(conn, owner, status="running", runtime_id=rt)
        mine = await steer(conn, owner, tid)
        await steer(conn, owner, tid, state="delivered")
        await steer(conn, owner, await task(conn, owner, status="running", runtime_id=other))
        assert [(s.id, s.task_id, s.text) for s in await dispatch.claim_steers(conn, [rt], T0)] == [(mine, tid,
                                                                                                  "look left")]
        assert await dispatch.claim_steers(conn, [rt], T0) == []


async def test_live_tokens_are_those_that_exist_unrevoked_among_many(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        a, b, revoked = await token(conn, owner), await token(conn, owner), await token(conn, owner, revoked=True)
        assert await registry.live_tokens(conn, [a, b, revoked, "tok_gone", a]) == {a, b}
        assert await registry.live_tokens(conn, []) == set()


async def test_connections_give_each_known_runtimes_current_connection_and_capabilities(db, registry):
    async with db.write() as conn:
        owner = await principal(conn)
        a = await runtime(conn, owner, connection_id="conn_a")
        b = await runtime(conn, owner, status="offline", connection_id=None)
        assert await registry.connections(conn, [a, b, "rt_gone"]) == {a: ("conn_a", CAPS), b: (None, CAPS)}
        assert await registry.connections(conn, []) == {}


async def test_one_round_claims_every_runtimes_due_work_at_once_each_row_naming_its_runtime(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        a, b, other = await runtime(conn, owner), await runtime(conn, owner), await runtime(conn, owner)
        ta = await task(conn, owner, status="dispatched", runtime_id=a, attempt=1)
        tb = await task(conn, owner, status="dispatched", runtime_id=b, attempt=1)
        t_other = await task(conn, owner, status="dispatched", runtime_id=other, attempt=1)
        for rt, t in ((a, ta), (b, tb), (other, t_other)):
            await reservation(conn, rt, t)
        ra = await task(conn, owner, status="running", runtime_id=a, cancel_requested_at=T0)
        rb = await task(conn, owner, status="running", runtime_id=b)
        await conn.execute(permission_replies.insert().values(task_id=rb, request_id="Bash", allow=False,
                                                              message="no", created_at=T0))
        sa_ = await steer(conn, owner, ra)
        assert sorted((r.runtime_id, r.task_id) for r in await dispatch.claim_dispatches(conn, [a, b], T0)) == \
            sorted([(a, ta), (b, tb)])
        assert [(c.runtime_id, c.task_id) for c in await dispatch.cancels_due(conn, [a, b])] == [(a, ra)]
        assert [(x.runtime_id, x.task_id, x.allow) for x in await dispatch.claim_permission_answers(conn, [a, b], T0)] \
            == [(b, rb, False)]
        assert [(s.runtime_id, s.id) for s in await dispatch.claim_steers(conn, [a, b], T0)] == [(a, sa_)]
        for claim in (dispatch.claim_dispatches, dispatch.claim_permission_answers, dispatch.claim_steers):
            assert await claim(conn, [a, b], T0) == []
        assert [r.task_id for r in await dispatch.claim_dispatches(conn, [other], T0)] == [t_other]
        assert await dispatch.claim_dispatches(conn, [], T0) == [] and await dispatch.cancels_due(conn, []) == []


async def test_a_steer_is_settled_once_delivered_to_its_turn_or_back_in_the_mailbox(db, reports):
    async with db.write() as conn:
        owner = await principal(conn)
        tid = await task(conn, owner, status="running")
        taken, back = await steer(conn, owner, tid), await steer(conn, owner, tid)
        await reports.settle_steer(conn, taken, tid, True, T0)
        await reports.settle_steer(conn, back, tid, False, T0)
        await reports.settle_steer(conn, taken, tid, False, T0)  # settled already: stays
        rows = {r.id: r for r in (await conn.execute(sa.select(mailbox))).all()}
    assert (rows[taken].state, rows[taken].task_id) == ("delivered", tid)
    assert (rows[back].state, rows[back].task_id) == ("queued", None)


# --- sessions a runtime serves ---------------------------------------------------------------------------------

async def test_a_session_sticks_to_the_runtime_of_its_first_run(db, reports):
    async with db.write() as conn:
        owner = await principal(conn)
        first, second = await runtime(conn, owner), await runtime(conn, owner)
        sid = await session(conn, owner)
        await reports.stick_session(conn, sid, first)
        await reports.stick_session(conn, sid, second)
    assert (await row(db, sessions, sid)).runtime_id == first


async def test_the_resume_handle_a_run_reported_is_kept_for_the_sessions_next_turn(db, reports):
    async with db.write() as conn:
        sid = await session(conn, await principal(conn))
        await reports.record_resume_handle(conn, sid, "resume-1", T0 + timedelta(hours=1))
    r = await row(db, sessions, sid)
    assert r.resume_handle == "resume-1" and utc(r.updated_at) == T0 + timedelta(hours=1)


async def test_a_sessions_memory_scope_is_unbound_until_its_first_launch_binds_it(db, reports):
    async with db.write() as conn:
        sid = await session(conn, await principal(conn))
        assert await reports.memory_scope(conn, sid) is None
        await reports.bind_memory_scope(conn, sid, "user:alice")
        assert await reports.memory_scope(conn, sid) == "user:alice"


# --- placement --------------------------------------------------------------------------------------------------

async def test_online_runtimes_count_their_pending_and_committed_reservations_as_used(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        a, b = await runtime(conn, owner), await runtime(conn, owner)
        for rt, state in ((a, "pending"), (a, "committed"), (a, "released"), (b, "released")):
            await reservation(conn, rt, await task(conn, owner), state=state)
        assert {r.id: r.used for r in await dispatch.online(conn)} == {a: 2, b: 0}


async def test_active_runs_by_owner_count_dispatched_and_running_runs(db, dispatch):
    async with db.write() as conn:
        alice, bob = await principal(conn), await principal(conn)
        for owner, status in ((alice, "dispatched"), (alice, "running"), (alice, "queued"), (bob, "failed")):
            await task(conn, owner, status=status)
        assert await dispatch.active_runs_by_owner(conn) == {alice: 2}


async def test_queue_heads_are_each_owners_oldest_queued_runs_with_their_place(db, dispatch):
    async with db.write() as conn:
        alice, bob = await principal(conn), await principal(conn)
        a = [await task(conn, alice, created_at=T0 + timedelta(seconds=i)) for i in range(3)]
        b = await task(conn, bob, created_at=T0 + timedelta(seconds=9))
        await task(conn, bob, status="running")
        heads = await dispatch.queue_heads(conn, 2)
    assert sorted((h.id, h.owner_id, h.place) for h in heads) == sorted(
        [(a[0], alice, 1), (a[1], alice, 2), (b, bob, 1)])


async def test_queue_heads_of_some_owners_are_only_theirs_with_the_same_places(db, dispatch):
    async with db.write() as conn:
        alice, bob = await principal(conn), await principal(conn)
        a = [await task(conn, alice, created_at=T0 + timedelta(seconds=i)) for i in range(3)]
        await task(conn, bob, created_at=T0)
        heads = await dispatch.queue_heads_of(conn, {alice}, 5)
        assert await dispatch.queue_heads_of(conn, set(), 5) == []
    assert sorted((h.id, h.place) for h in heads) == sorted([(a[0], 1), (a[1], 2), (a[2], 3)])


async def test_active_runs_by_owner_and_runtime_count_each_owners_runs_on_each_runtime(db, dispatch):
    async with db.write() as conn:
        alice, bob = await principal(conn), await principal(conn)
        x, y = await runtime(conn, alice), await runtime(conn, alice)
        for owner, rt, status in ((alice, x, "dispatched"), (alice, x, "running"), (alice, y, "running"),
                                  (bob, x, "running"), (bob, y, "succeeded")):
            await task(conn, owner, status=status, runtime_id=rt)
        assert await dispatch.active_runs_by_owner_and_runtime(conn) == {(alice, x): 2, (alice, y): 1, (bob, x): 1}


async def test_lock_queued_returns_only_runs_still_queued(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        queued = await task(conn, owner)
        taken = await task(conn, owner, status="dispatched")
        assert [r.id for r in await dispatch.lock_queued(conn, [queued, taken, "tr_nope"])] == [queued]


async def test_lock_queued_skips_runs_another_replica_holds(pg_url):
    db = Database(pg_url)
    dispatch = SqlDispatchStore(db)
    try:
        async with db.write() as conn:
            owner = await principal(conn)
            held, free = await task(conn, owner), await task(conn, owner)
        async with db.write() as first:
            assert [r.id for r in await dispatch.lock_queued(first, [held])] == [held]
            async with db.write() as second:  # another replica's placement, while the first holds its row
                assert [r.id for r in await asyncio.wait_for(dispatch.lock_queued(second, [held, free]), 5)] == [free]
    finally:
        await db.close()


async def test_admin_holders_are_the_principals_with_a_live_admin_token(db, dispatch):
    async with db.write() as conn:
        admin, revoked, user = await principal(conn), await principal(conn), await principal(conn)
        await token(conn, admin, admin=True)
        await token(conn, admin, admin=True)
        await token(conn, revoked, admin=True, revoked=True)
        await token(conn, user)
        assert await dispatch.admin_holders(conn, {admin, revoked, user}) == {admin}
        assert await dispatch.admin_holders(conn, set()) == set()


async def test_busy_sessions_have_a_run_dispatched_or_running(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        await task(conn, owner, status="running", session_id="ses_a")
        await task(conn, owner, status="dispatched", session_id="ses_b")
        await task(conn, owner, status="queued", session_id="ses_c")
        await task(conn, owner, status="running")
        assert await dispatch.busy_sessions(conn) == {"ses_a", "ses_b"}


async def test_reserve_writes_a_pending_reservation_and_dispatches_each_task(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        tid = await task(conn, owner, attempt=1)
        await conn.execute(task_runs.update().where(task_runs.c.id == tid).values(last_rseq=7))
        deadline = T0 + timedelta(minutes=30)
        await dispatch.reserve(conn, [Placement(task_id=tid, runtime_id=rt, attempt=2, deadline_at=deadline)], T0,
                            T0 + timedelta(seconds=30))
        await dispatch.reserve(conn, [], T0, T0)
        res = (await conn.execute(sa.select(reservations).where(reservations.c.task_id == tid))).one()
    assert (res.runtime_id, res.attempt, res.state, res.sent_at) == (rt, 2, "pending", None)
    assert utc(res.expires_at) == T0 + timedelta(seconds=30)
    r = await row(db, task_runs, tid)
    assert (r.status, r.runtime_id, r.attempt, r.last_rseq) == ("dispatched", rt, 2, 0)
    assert utc(r.deadline_at) == deadline and utc(r.dispatched_at) == T0


# --- the reaper -----------------------------------------------------------------------------------------------

async def test_release_expired_frees_past_ttl_reservations_and_requeues_tasks_still_dispatched(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        waiting = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1)
        w_res = await reservation(conn, rt, waiting, expires_at=T0)
        started = await task(conn, owner, status="running", runtime_id=rt, attempt=1)
        s_res = await reservation(conn, rt, started, expires_at=T0)
        fresh = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1)
        f_res = await reservation(conn, rt, fresh, expires_at=T0 + timedelta(minutes=5))
        out = await dispatch.release_expired(conn, T0 + timedelta(seconds=1))
    assert sorted(out, key=lambda e: e.task_id) == sorted(
        [ExpiredReservation(waiting, True), ExpiredReservation(started, False)], key=lambda e: e.task_id)
    states = [(await row(db, reservations, r)).state for r in (w_res, s_res, f_res)]
    assert states == ["released", "released", "pending"]
    r = await row(db, task_runs, waiting)
    assert (r.status, r.runtime_id) == ("queued", None)
    assert (await row(db, task_runs, started)).status == "running"


async def test_the_reaper_and_a_runners_acceptance_take_task_then_reservation_and_never_deadlock(pg_url):
    db = Database(pg_url)
    reports = SqlReportStore(db)
    dispatch = SqlDispatchStore(db)
    try:
        async with db.write() as conn:
            owner = await principal(conn)
            rt = await runtime(conn, owner)
            tid = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1)
            res = await reservation(conn, rt, tid, expires_at=T0)

        async def reap() -> list[ExpiredReservation]:
            async with db.write() as conn:
                return await dispatch.release_expired(conn, T0 + timedelta(seconds=1))

        async with db.write() as accept:  # the runner's acceptance: the task row first …
            assert await reports.held_run(accept, rt, tid, 1) is not None
            reaper = await waits(reap())  # … so the reaper waits on that row before it touches the reservation
            await reports.start_run(accept, tid, 1, T0)
        assert await asyncio.wait_for(reaper, 10) == [ExpiredReservation(tid, False)]
        assert (await row(db, task_runs, tid)).status == "running"
        assert (await row(db, reservations, res)).state == "committed"
    finally:
        await db.close()


async def test_runtimes_silent_since_a_time_are_the_online_or_offline_ones_last_seen_before_it(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        old_on = await runtime(conn, owner, last_seen=T0)
        old_off = await runtime(conn, owner, status="offline", last_seen=T0)
        await runtime(conn, owner, status="lost", last_seen=T0)
        await runtime(conn, owner, last_seen=T0 + timedelta(minutes=10))
        assert sorted(await dispatch.silent_since(conn, T0 + timedelta(minutes=1))) == sorted([old_on, old_off])


async def test_mark_lost_forgets_the_runtimes_connection(db, dispatch):
    async with db.write() as conn:
        rt = await runtime(conn, await principal(conn), last_seen=T0)
        assert await dispatch.mark_lost(conn, rt, T0 + timedelta(minutes=1))
    r = await row(db, runtimes, rt)
    assert (r.status, r.connection_id) == ("lost", None)


async def test_mark_lost_leaves_a_runtime_that_was_seen_since_the_reaper_read_it(db, dispatch):
    """The reaper reads the silent runtimes, then marks each: a heartbeat committed in between keeps it online (and
    its runs running), instead of a healthy runner's connection being forgotten."""
    async with db.write() as conn:
        rt = await runtime(conn, await principal(conn), last_seen=T0)
        assert await dispatch.silent_since(conn, T0 + timedelta(minutes=1)) == [rt]
        await conn.execute(runtimes.update().where(runtimes.c.id == rt).values(
            last_seen_at=T0 + timedelta(minutes=2)))  # its heartbeat
        assert not await dispatch.mark_lost(conn, rt, T0 + timedelta(minutes=1))
    r = await row(db, runtimes, rt)
    assert r.status == "online" and r.connection_id is not None


async def test_overdue_runs_are_active_runs_past_their_deadline(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        late = await task(conn, owner, status="running", deadline_at=T0)
        await task(conn, owner, status="running", deadline_at=T0 + timedelta(hours=1))
        await task(conn, owner, status="succeeded", deadline_at=T0)
        assert await dispatch.overdue(conn, T0 + timedelta(seconds=1)) == [late]


async def test_queued_since_returns_runs_queued_before_a_time_up_to_the_limit(db, dispatch):
    async with db.write() as conn:
        owner = await principal(conn)
        old = [await task(conn, owner, created_at=T0) for _ in range(3)]
        await task(conn, owner, created_at=T0 + timedelta(hours=1))
        await task(conn, owner, status="dispatched", created_at=T0)
        got = await dispatch.queued_since(conn, T0 + timedelta(minutes=1))
        assert sorted(r.id for r in got) == sorted(old) and got[0].snapshot == {"engine": "scripted"}
        assert len(await dispatch.queued_since(conn, T0 + timedelta(minutes=1), limit=2)) == 2
