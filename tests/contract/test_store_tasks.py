"""SqlTaskStore: each rule its methods state, on SQLite and PostgreSQL."""
from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from hub.clock import utc
from hub.domain.tasks import Status
from hub.services.tasks.service import finish_task
from hub.store.db import Database
from hub.store.tables import reservations, task_runs
from hub.store.tasks import QueuedTask, SqlTaskStore, event_rows
from tests.contract.task_rows import T0, event, principal, reservation, row, runtime, task, waits


@pytest.fixture
def store(db: Database) -> SqlTaskStore:
    """The task store over each backend."""
    return SqlTaskStore(db)


async def test_ping_answers_while_the_database_answers(db, store):
    async with db.read() as conn:
        assert await store.ping(conn) is None


async def test_ping_raises_when_the_database_cannot_be_reached():
    gone = Database("postgresql+asyncpg://postgres@127.0.0.1:9/none")  # nothing listens on the discard port
    with pytest.raises(OSError):
        async with gone.read() as conn:
            await SqlTaskStore(gone).ping(conn)
    await gone.close()


async def test_a_second_transaction_locking_the_same_principal_waits_for_the_first(db, store):
    async with db.write() as conn:
        alice = await principal(conn)

    async def second() -> int:
        async with db.write() as conn:
            await store.lock_principal(conn, alice)
            return await store.count_queued(conn, alice)

    async with db.write() as conn:
        await store.lock_principal(conn, alice)
        later = await waits(second())
        await task(conn, alice)
    assert await later == 1  # it counted after the first transaction's task was committed


async def test_count_queued_counts_only_the_principals_queued_runs(db, store):
    async with db.write() as conn:
        alice, bob = await principal(conn), await principal(conn)
        await task(conn, alice)
        await task(conn, alice, kind="turn")
        await task(conn, alice, status="running")
        await task(conn, bob)
        assert await store.count_queued(conn, alice) == 2


async def test_insert_queued_freezes_the_snapshot_with_attempt_zero_and_no_events(db, store):
    async with db.write() as conn:
        alice = await principal(conn)
        await store.insert_queued_many(conn, [QueuedTask(
            task_id="tr_new", owner_id=alice, name="n", prompt="say x", snapshot={"engine": "scripted", "model": "m"},
            now=T0, parent_session_id="ses_p", parent_turn_id=None)])
    r = await row(db, task_runs, "tr_new")
    assert (r.status, r.attempt, r.event_seq, r.last_rseq, r.kind) == ("queued", 0, 0, 0, "task")
    assert r.snapshot == {"engine": "scripted", "model": "m"} and r.parent_session_id == "ses_p"


async def test_get_returns_none_for_an_unknown_run(db, store):
    async with db.write() as conn:
        assert await store.get(conn, "tr_nope") is None
        assert await store.get_for_update(conn, "tr_nope") is None


async def test_a_run_read_for_update_is_held_until_the_transaction_ends(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn))

    async def second() -> str:
        async with db.write() as conn:
            return (await store.get_for_update(conn, tid)).status

    async with db.write() as conn:
        assert (await store.get_for_update(conn, tid)).id == tid
        later = await waits(second())
        await conn.execute(task_runs.update().where(task_runs.c.id == tid).values(status="cancelled"))
    assert await later == "cancelled"


async def test_list_tasks_returns_the_owners_newest_tasks_first_never_turns(db, store):
    async with db.write() as conn:
        alice, bob = await principal(conn), await principal(conn)
        old = await task(conn, alice, created_at=T0)
        new = await task(conn, alice, created_at=T0 + timedelta(seconds=5))
        await task(conn, alice, kind="turn", created_at=T0 + timedelta(seconds=9))
        await task(conn, bob, created_at=T0 + timedelta(seconds=9))
        assert [r.id for r in await store.list_tasks(conn, alice, 10)] == [new, old]
        assert [r.id for r in await store.list_tasks(conn, alice, 1)] == [new]


async def test_events_after_returns_events_past_the_cursor_in_sequence_order_up_to_the_limit(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn), event_seq=4)
        for seq in (3, 1, 4, 2):
            await event(conn, tid, seq, "say", {"text": str(seq)})
        assert [e.seq for e in await store.events_after(conn, tid, 1, 2)] == [2, 3]
        assert [e.payload["text"] for e in await store.events_after(conn, tid, 0, 10)] == ["1", "2", "3", "4"]


async def test_append_event_numbers_it_after_the_event_seq_and_advances_it(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn), event_seq=7)
        assert await store.append_event(conn, tid, "warning", {"text": "a"}, T0) == 8
        assert await store.append_event(conn, tid, "warning", {"text": "b"}, T0) == 9
        assert [(e.seq, e.payload["text"]) for e in await store.events_after(conn, tid, 0, 10)] == [(8, "a"), (9, "b")]
    assert (await row(db, task_runs, tid)).event_seq == 9


async def test_an_event_numbered_twice_fails_instead_of_doubling(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn))
        await store.append_event(conn, tid, "say", {"text": "a"}, T0)
    with pytest.raises(sa.exc.IntegrityError):
        async with db.write() as conn:
            await conn.execute(task_runs.update().where(task_runs.c.id == tid).values(event_seq=0))  # a stale reader
            await store.append_event(conn, tid, "say", {"text": "b"}, T0)
    async with db.read() as conn:
        assert [e.payload["text"] for e in await store.events_after(conn, tid, 0, 10)] == ["a"]


async def test_runner_events_are_numbered_after_event_seq_and_record_the_last_runner_sequence(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn), event_seq=2)
        await store.insert_event_rows(conn, event_rows(tid, [("say", {"text": "x"}), ("tool", {"name": "Read"})], T0,
                                                       event_seq=2))
        await store.mark_events_seen(conn, tid, event_seq=4, last_rseq=5, usage={"input": 3})
        assert [(e.seq, e.type) for e in await store.events_after(conn, tid, 0, 10)] == [(3, "say"), (4, "tool")]
    r = await row(db, task_runs, tid)
    assert (r.event_seq, r.last_rseq, r.usage_json) == (4, 5, {"input": 3})


async def test_runner_resends_skipped_entirely_still_advance_the_last_runner_sequence(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn), event_seq=3)
        await store.insert_event_rows(conn, event_rows(tid, [], T0, event_seq=3))
        await store.mark_events_seen(conn, tid, event_seq=3, last_rseq=9, usage=None)
    r = await row(db, task_runs, tid)
    assert (r.event_seq, r.last_rseq) == (3, 9)
    async with db.read() as conn:
        assert await store.events_after(conn, tid, 0, 10) == []


async def test_request_cancel_marks_the_run_for_its_runner(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn), status="running")
        await store.request_cancel(conn, tid, T0)
    r = await row(db, task_runs, tid)
    assert r.status == "running" and utc(r.cancel_requested_at) == T0


async def test_finish_moves_an_active_run_to_its_outcome_and_releases_its_reservation(db, store):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        tid = await task(conn, owner, status="running", runtime_id=rt, attempt=1, error="kept")
        res = await reservation(conn, rt, tid, state="committed")
        assert await store.finish(conn, tid, Status.SUCCEEDED, T0, result_text="done", usage={"output": 1})
    r = await row(db, task_runs, tid)
    assert (r.status, r.outcome, r.result_text, r.usage_json) == ("succeeded", "succeeded", "done", {"output": 1})
    assert r.error == "kept" and utc(r.finished_at) == T0  # only the fields given are written
    assert (await row(db, reservations, res)).state == "released"


async def test_a_run_that_started_and_ended_in_one_batch_gets_its_start_and_event_counter_with_its_outcome(db, store):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        tid = await task(conn, owner, status="dispatched", runtime_id=rt, attempt=1)
        res = await reservation(conn, rt, tid, state="pending")  # never committed: accepted in the same batch
        assert await store.finish(conn, tid, Status.SUCCEEDED, T0, started_at=T0 - timedelta(seconds=1),
                                  event_seq=2, last_rseq=3)
    r = await row(db, task_runs, tid)
    assert (r.status, r.event_seq, r.last_rseq) == ("succeeded", 2, 3)
    assert utc(r.started_at) == T0 - timedelta(seconds=1) and utc(r.finished_at) == T0
    assert (await row(db, reservations, res)).state == "released"


async def test_finish_of_a_terminal_run_is_refused_and_writes_nothing(db, store):
    async with db.write() as conn:
        owner = await principal(conn)
        rt = await runtime(conn, owner)
        tid = await task(conn, owner, status="cancelled", runtime_id=rt, outcome="cancelled")
        res = await reservation(conn, rt, tid, state="committed")  # not the state a real run is left in: a probe
        assert not await store.finish(conn, tid, Status.FAILED, T0, error="late")
    r = await row(db, task_runs, tid)
    assert (r.status, r.outcome, r.error, r.finished_at) == ("cancelled", "cancelled", None, None)
    assert (await row(db, reservations, res)).state == "committed"


async def test_finish_task_keeps_its_import_path_and_delegates_to_the_store(db):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn))
        assert await finish_task(conn, tid, Status.CANCELLED, T0, error="cancelled before it started")
        assert not await finish_task(conn, tid, Status.FAILED, T0)
    assert (await row(db, task_runs, tid)).status == "cancelled"


async def test_permission_requests_are_the_payloads_of_permission_events_only(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn), status="running")
        await event(conn, tid, 1, "permission", {"request_id": "Bash"})
        await event(conn, tid, 2, "say", {"request_id": "not-a-request"})
        await event(conn, tid, 3, "permission", {"request_id": "Write"})
        assert sorted(p["request_id"] for p in await store.permission_requests(conn, tid)) == ["Bash", "Write"]


async def test_a_permission_request_is_unanswered_until_its_answer_is_recorded(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn), status="running")
        assert await store.permission_answer(conn, tid, "Bash") is None
        await store.record_permission_answer(conn, tid, "Bash", False, "no", T0)
        assert await store.permission_answer(conn, tid, "Bash") is False
        assert await store.permission_answer(conn, tid, "Write") is None


async def test_a_second_answer_to_one_permission_request_violates_its_key(db, store):
    async with db.write() as conn:
        tid = await task(conn, await principal(conn), status="running")
        await store.record_permission_answer(conn, tid, "Bash", True, "", T0)
    with pytest.raises(sa.exc.IntegrityError):
        async with db.write() as conn:
            await store.record_permission_answer(conn, tid, "Bash", False, "", T0)
    async with db.read() as conn:
        assert await store.permission_answer(conn, tid, "Bash") is True


async def test_count_by_status_counts_every_run_and_omits_empty_statuses(db, store):
    async with db.write() as conn:
        owner = await principal(conn)
        for status in ("queued", "queued", "running"):
            await task(conn, owner, status=status)
        await task(conn, owner, kind="turn", status="running")
        assert await store.count_by_status(conn) == {"queued": 2, "running": 2}
