"""SqlInstanceStore on SQLite and PostgreSQL: one test per rule its methods state."""
from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from hub.clock import ManualClock, utc
from hub.store.db import Database
from hub.store.instances import CurrentRun, Mail, SqlInstanceStore
from hub.store.tables import mailbox, principals, task_runs

SNAPSHOT = {"engine": "scripted", "permission_policy": "ask", "profile": {"ref": "scripted"}}


@pytest.fixture
async def store(db: Database, clock: ManualClock) -> SqlInstanceStore:
    """An instance store over a database holding principal alice and her instances ai_1 and ai_2."""
    async with db.write() as conn:
        await conn.execute(principals.insert().values(id="alice", kind="user", name="alice", created_at=clock.now()))
    s = SqlInstanceStore(db)
    async with db.write() as conn:
        await s.create(conn, instance_id="ai_1", owner_id="alice", name="helper", session_id="ses_1",
                       snapshot=SNAPSHOT, now=clock.now())
        await s.create(conn, instance_id="ai_2", owner_id="alice", name=None, session_id="ses_2",
                       snapshot=SNAPSHOT, now=clock.now())
    return s


async def add_run(db: Database, clock: ManualClock, run_id: str, status: str, runtime_id: str | None = None) -> None:
    async with db.write() as conn:
        await conn.execute(task_runs.insert().values(
            id=run_id, owner_id="alice", prompt="p", snapshot={}, status=status, attempt=0, event_seq=0,
            last_rseq=0, created_at=clock.now(), runtime_id=runtime_id, instance_id="ai_1"))


async def mail(store: SqlInstanceStore, clock: ManualClock, mid: str, iid: str = "ai_1", *, kind: str = "queued",
               state: str = "queued", task_id: str | None = None) -> None:
    async with store.db.write() as conn:
        await store.add_mail(conn, message_id=mid, instance_id=iid, text=f"text of {mid}", kind=kind, state=state,
                             task_id=task_id, now=clock.now())


async def mail_row(db: Database, mid: str):
    async with db.read() as conn:
        return (await conn.execute(sa.select(mailbox).where(mailbox.c.id == mid))).first()


async def test_a_created_instance_is_bound_to_its_child_session_and_snapshot_with_no_run(store, clock):
    async with store.db.read() as conn:
        inst = await store.get(conn, "ai_1")
        assert await store.get(conn, "ai_missing") is None
    assert (inst.owner_id, inst.name, inst.session_id, inst.snapshot) == ("alice", "helper", "ses_1", SNAPSHOT)
    assert inst.current_task_id is None and inst.archived_at is None
    assert utc(inst.created_at) == utc(inst.updated_at) == clock.now()


async def test_two_writers_of_one_instance_wait_for_each_other(store, clock):
    first_holds, release = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with store.db.write() as conn:
            await store.get(conn, "ai_1")
            await store.set_current_run(conn, "ai_1", "tr_1", clock.now())
            first_holds.set()
            await release.wait()

    async def second() -> str | None:
        async with store.db.write() as conn:
            return (await store.get(conn, "ai_1")).current_task_id

    a = asyncio.create_task(first())
    await first_holds.wait()
    b = asyncio.create_task(second())
    await asyncio.sleep(0.3)
    assert not b.done()  # the second writer waits for the first one's lock
    release.set()
    await a
    assert await b == "tr_1"  # and then sees what the first one wrote


async def test_the_current_run_is_what_the_instance_was_last_pointed_at(store, clock):
    async with store.db.write() as conn:
        await store.set_current_run(conn, "ai_1", "tr_1", clock.now())
        later = clock.advance(3)
        await store.set_current_run(conn, "ai_1", "tr_2", later)
    async with store.db.read() as conn:
        inst, other = await store.get(conn, "ai_1"), await store.get(conn, "ai_2")
    assert inst.current_task_id == "tr_2" and utc(inst.updated_at) == later
    assert other.current_task_id is None


async def test_an_archived_instance_is_marked_archived_at_that_time(store, clock):
    later = clock.advance(60)
    async with store.db.write() as conn:
        await store.archive(conn, "ai_1", later)
    async with store.db.read() as conn:
        assert utc((await store.get(conn, "ai_1")).archived_at) == later
        assert (await store.get(conn, "ai_2")).archived_at is None


async def test_the_current_run_reads_its_status_and_runtime_and_none_without_a_run(store, clock):
    await add_run(store.db, clock, "tr_1", "running", runtime_id="rt_1")
    await add_run(store.db, clock, "tr_2", "queued")
    async with store.db.read() as conn:
        assert await store.current_run(conn, "tr_1") == CurrentRun("running", "rt_1")
        assert await store.current_run(conn, "tr_2") == CurrentRun("queued", None)
        assert await store.current_run(conn, None) is None
        assert await store.current_run(conn, "tr_missing") is None


async def test_queued_mail_is_the_instances_undelivered_input_oldest_first(store, clock):
    await mail(store, clock, "mb_b")
    clock.advance(1)
    await mail(store, clock, "mb_a")
    clock.advance(1)
    await mail(store, clock, "mb_steer", kind="steer", state="pending", task_id="tr_1")
    await mail(store, clock, "mb_other", "ai_2")
    await mail(store, clock, "mb_done", state="delivered")
    async with store.db.read() as conn:
        assert await store.queued_mail(conn, "ai_1") == [Mail("mb_b", "text of mb_b"), Mail("mb_a", "text of mb_a")]


async def test_the_queued_count_counts_only_undelivered_input_of_that_instance(store, clock):
    await mail(store, clock, "mb_1")
    await mail(store, clock, "mb_2")
    await mail(store, clock, "mb_steer", kind="steer", state="pending", task_id="tr_1")
    await mail(store, clock, "mb_other", "ai_2")
    async with store.db.read() as conn:
        assert await store.count_queued(conn, "ai_1") == 2
        assert await store.count_queued(conn, "ai_missing") == 0


async def test_delivered_mail_names_its_run_and_leaves_the_queue(store, clock):
    await mail(store, clock, "mb_1")
    await mail(store, clock, "mb_2")
    await mail(store, clock, "mb_3")
    later = clock.advance(2)
    async with store.db.write() as conn:
        await store.deliver(conn, ["mb_1", "mb_2"], "tr_9", later)
        await store.deliver(conn, [], "tr_10", later)  # nothing queued: nothing changes
    row = await mail_row(store.db, "mb_1")
    assert (row.state, row.task_id, utc(row.settled_at)) == ("delivered", "tr_9", later)
    async with store.db.read() as conn:
        assert [m.id for m in await store.queued_mail(conn, "ai_1")] == ["mb_3"]
    assert (await mail_row(store.db, "mb_3")).task_id is None


async def test_a_pending_steer_is_offered_to_the_running_task_and_queued_input_waits_for_the_next_run(store, clock):
    await mail(store, clock, "mb_steer", kind="steer", state="pending", task_id="tr_1")
    await mail(store, clock, "mb_input")
    steer, queued = await mail_row(store.db, "mb_steer"), await mail_row(store.db, "mb_input")
    assert (steer.kind, steer.state, steer.task_id, utc(steer.created_at)) == ("steer", "pending", "tr_1", clock.now())
    assert (queued.kind, queued.state, queued.task_id) == ("queued", "queued", None)
    assert steer.settled_at is None and steer.sent_at is None


async def test_a_messages_state_is_read_and_none_when_there_is_no_such_message(store, clock):
    await mail(store, clock, "mb_1")
    async with store.db.read() as conn:
        assert await store.mail_state(conn, "mb_1") == "queued"
        assert await store.mail_state(conn, "mb_missing") is None


async def test_giving_up_a_pending_steer_marks_it_unknown_but_never_one_its_runner_settled(store, clock):
    await mail(store, clock, "mb_pending", kind="steer", state="pending", task_id="tr_1")
    await mail(store, clock, "mb_taken", kind="steer", state="delivered", task_id="tr_1")
    await mail(store, clock, "mb_back", kind="steer", state="queued")
    later = clock.advance(5)
    async with store.db.write() as conn:
        assert await store.give_up_steer(conn, "mb_pending", later) is True
        assert await store.give_up_steer(conn, "mb_taken", later) is False
        assert await store.give_up_steer(conn, "mb_back", later) is False
    pending = await mail_row(store.db, "mb_pending")
    assert (pending.state, utc(pending.settled_at)) == ("unknown", later)
    assert (await mail_row(store.db, "mb_taken")).state == "delivered"
    assert (await mail_row(store.db, "mb_back")).state == "queued"
