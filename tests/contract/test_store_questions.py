"""SqlQuestionStore on SQLite and PostgreSQL: one test per rule its methods state."""
from __future__ import annotations

import pytest
import sqlalchemy as sa

from hub.clock import ManualClock
from hub.store.db import Database
from hub.store.questions import NewQuestion, SqlQuestionStore
from hub.store.sessions import NewRun, NewSession, SqlSessionStore
from hub.store.tables import principals, session_questions, task_runs


@pytest.fixture
async def store(db: Database, clock: ManualClock) -> SqlQuestionStore:
    """A question store over a database holding alice's session ses_a with Turns t1..t3 (t1, t2 waiting)."""
    sessions = SqlSessionStore(db)
    async with db.write() as conn:
        await conn.execute(principals.insert().values(id="alice", kind="user", name="alice", created_at=clock.now()))
        await sessions.create(conn, NewSession(
            id="ses_a", name=None, owner_id="alice", kind="interactive", source="feishu", engine="claude", model=None,
            reasoning_effort=None, snapshot={"engine": "claude"}, runtime_id=None, memory_scope=None), clock.now())
        for run_id in ("t1", "t2", "t3"):
            s = await sessions.get(conn, "ses_a", lock=True)
            await sessions.queue_run(conn, s, NewRun(id=run_id, kind="turn", prompt="hi", snapshot={}), clock.now())
        await conn.execute(task_runs.update().where(task_runs.c.id.in_(["t1", "t2"])).values(status="waiting_for_user"))
    return SqlQuestionStore(db)


def question(qid: str, turn_id: str) -> NewQuestion:
    return NewQuestion(id=qid, turn_id=turn_id, session_id="ses_a", owner_id="alice", text="Which database?",
                       options=["PostgreSQL", "SQLite"], free_text=True)


async def record(store: SqlQuestionStore, clock: ManualClock, *qs: NewQuestion) -> None:
    async with store.db.write() as conn:
        for q in qs:
            await store.record(conn, q, clock.now())


async def test_a_turns_question_is_stored_open_once_however_often_its_end_is_reported(store, clock):
    await record(store, clock, question("q1", "t1"), question("q1b", "t1"))
    async with store.db.read() as conn:
        rows = (await conn.execute(sa.select(session_questions))).all()
        got = await store.get(conn, "q1")
    assert [(r.id, r.state) for r in rows] == [("q1", "open")]
    assert got.turn_status == "waiting_for_user" and got.options == ["PostgreSQL", "SQLite"] and got.free_text


async def test_get_and_of_turn_return_none_for_what_does_not_exist(store, clock):
    async with store.db.read() as conn:
        assert await store.get(conn, "q_none") is None
        assert await store.of_turn(conn, "t3") is None


async def test_the_waiting_question_is_the_latest_open_one_whose_turn_still_waits(store, clock):
    await record(store, clock, question("q1", "t1"))
    clock.advance(5)
    await record(store, clock, question("q2", "t2"))
    async with store.db.read() as conn:
        assert (await store.waiting(conn, "ses_a")).id == "q2"
    async with store.db.write() as conn:
        await conn.execute(task_runs.update().where(task_runs.c.id == "t2").values(status="cancelled"))
    async with store.db.read() as conn:
        assert (await store.waiting(conn, "ses_a")).id == "q1"


async def test_a_question_takes_one_answer_and_a_second_changes_nothing(store, clock):
    await record(store, clock, question("q1", "t1"))
    async with store.db.write() as conn:
        assert await store.answer(conn, "q1", "SQLite", "t3", clock.now()) is True
        assert await store.answer(conn, "q1", "PostgreSQL", "t4", clock.now()) is False
    async with store.db.read() as conn:
        q = await store.of_turn(conn, "t1")
        assert await store.waiting(conn, "ses_a") is None
    assert (q.state, q.answer, q.answer_turn_id) == ("answered", "SQLite", "t3")


async def test_cancelling_a_waiting_turn_withdraws_its_question_and_a_running_turn_is_left_alone(store, clock):
    await record(store, clock, question("q1", "t1"))
    async with store.db.write() as conn:
        assert await store.cancel_waiting_turn(conn, "t1", clock.now()) is True
        assert await store.cancel_waiting_turn(conn, "t1", clock.now()) is False
        assert await store.cancel_waiting_turn(conn, "t3", clock.now()) is False  # queued, not waiting
    async with store.db.read() as conn:
        q = await store.get(conn, "q1")
        t3 = (await conn.execute(sa.select(task_runs.c.status).where(task_runs.c.id == "t3"))).scalar()
    assert (q.state, q.turn_status, t3) == ("withdrawn", "cancelled", "queued")
