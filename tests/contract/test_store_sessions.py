"""SqlSessionStore on SQLite and PostgreSQL: one test per rule its methods state."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest
import sqlalchemy as sa

from hub.clock import ManualClock, utc
from hub.store.db import Database
from hub.store.sessions import NewRun, NewSession, SqlSessionStore
from hub.store.tables import principals, runtimes, sessions, task_runs


@pytest.fixture
async def store(db: Database, clock: ManualClock) -> SqlSessionStore:
    """A session store over a database holding principals alice and bob and the runtime rt1."""
    async with db.write() as conn:
        for pid in ("alice", "bob"):
            await conn.execute(principals.insert().values(id=pid, kind="user", name=pid, created_at=clock.now()))
        await conn.execute(runtimes.insert().values(id="rt_1", name="rt1", principal_id="alice", shared=False,
                                                    capabilities={}, slots=1, status="online",
                                                    registered_at=clock.now(), last_seen_at=clock.now()))
    return SqlSessionStore(db)


def new_session(sid: str, owner: str = "alice", *, name: str | None = None, runtime_id: str | None = None,
                memory_scope: str | None = "pending:global") -> NewSession:
    return NewSession(id=sid, name=name, owner_id=owner, kind="interactive", source="cli", engine="scripted",
                      model="m1", reasoning_effort="low", snapshot={"engine": "scripted", "model": "m1"},
                      runtime_id=runtime_id, memory_scope=memory_scope)


async def make(store: SqlSessionStore, clock: ManualClock, *sessions_: NewSession) -> None:
    async with store.db.write() as conn:
        for s in sessions_:
            await store.create(conn, s, clock.now())


async def queue(store: SqlSessionStore, clock: ManualClock, sid: str, run_id: str, kind: str = "turn") -> int:
    async with store.db.write() as conn:
        s = await store.get(conn, sid, lock=True)
        return await store.queue_run(conn, s, NewRun(id=run_id, kind=kind, prompt="say hi", snapshot={"x": 1}),
                                     clock.now())


async def set_status(db: Database, run_id: str, status: str) -> None:
    async with db.write() as conn:
        await conn.execute(task_runs.update().where(task_runs.c.id == run_id).values(status=status))


async def test_a_session_name_is_found_only_among_its_owners_sessions(store, clock):
    await make(store, clock, new_session("ses_a", name="desk"), new_session("ses_b", "bob", name="other"))
    async with store.db.read() as conn:
        assert await store.id_by_name(conn, "alice", "desk") == "ses_a"
        assert await store.id_by_name(conn, "bob", "desk") is None
        assert await store.id_by_name(conn, "alice", "other") is None


async def test_a_session_ref_matches_an_id_or_a_name_of_the_owner_and_never_another_owners(store, clock):
    await make(store, clock, new_session("ses_a", name="desk"), new_session("ses_b", name="ses_c"),
               new_session("ses_c"), new_session("ses_d", "bob", name="desk"))
    async with store.db.read() as conn:
        assert await store.ids_by_ref(conn, "alice", "ses_a") == ["ses_a"]
        assert await store.ids_by_ref(conn, "alice", "desk") == ["ses_a"]
        assert await store.ids_by_ref(conn, "alice", "ses_c") == ["ses_b", "ses_c"]  # a name that is another's id
        assert await store.ids_by_ref(conn, "bob", "ses_a") == []
        assert await store.ids_by_ref(conn, "bob", "desk") == ["ses_d"]


async def test_a_new_session_sticks_to_the_runtime_of_that_name_and_to_none_when_no_runtime_has_it(store):
    async with store.db.read() as conn:
        assert await store.runtime_id(conn, "rt1") == "rt_1"
        assert await store.runtime_id(conn, "nope") is None


async def test_a_sessions_sticky_runtime_name_is_none_without_a_runtime_or_when_it_is_gone(store):
    async with store.db.read() as conn:
        assert await store.runtime_name(conn, "rt_1") == "rt1"
        assert await store.runtime_name(conn, None) is None
        assert await store.runtime_name(conn, "rt_gone") is None


async def test_a_created_session_has_no_runs_and_was_created_and_updated_now(store, clock):
    await make(store, clock, new_session("ses_a", name="desk", runtime_id="rt_1"))
    async with store.db.read() as conn:
        s = await store.get(conn, "ses_a")
        assert await store.get(conn, "ses_missing") is None
    assert s.turns == 0 and s.owner_id == "alice" and s.name == "desk" and s.runtime_id == "rt_1"
    assert s.engine == "scripted" and s.model == "m1" and s.reasoning_effort == "low"
    assert s.memory_scope == "pending:global" and s.snapshot == {"engine": "scripted", "model": "m1"}
    assert utc(s.created_at) == utc(s.updated_at) == clock.now()


async def test_a_queued_run_takes_the_next_seq_on_the_sessions_owner_and_parent_and_counts_on_the_session(store, clock):
    await make(store, clock, new_session("ses_a"))
    async with store.db.write() as conn:
        await conn.execute(sessions.update().where(sessions.c.id == "ses_a").values(parent_session_id="ses_p"))
    assert await queue(store, clock, "ses_a", "turn_1") == 1
    later = clock.advance(5)
    assert await queue(store, clock, "ses_a", "tr_2", kind="task") == 2
    async with store.db.read() as conn:
        runs = (await conn.execute(sa.select(task_runs).where(task_runs.c.session_id == "ses_a")
                                   .order_by(task_runs.c.turn_seq))).all()
        s = await store.get(conn, "ses_a")
    assert [(r.id, r.turn_seq, r.kind, r.status) for r in runs] == [("turn_1", 1, "turn", "queued"),
                                                                   ("tr_2", 2, "task", "queued")]
    assert {r.owner_id for r in runs} == {"alice"} and {r.parent_session_id for r in runs} == {"ses_p"}
    assert runs[0].snapshot == {"x": 1} and runs[0].attempt == 0 and runs[0].event_seq == 0
    assert s.turns == 2 and utc(s.updated_at) == later


async def test_two_writers_queueing_in_one_session_wait_for_each_other_and_take_consecutive_seqs(store, clock):
    await make(store, clock, new_session("ses_a"))
    first_holds, release = asyncio.Event(), asyncio.Event()

    async def first() -> int:
        async with store.db.write() as conn:
            s = await store.get(conn, "ses_a", lock=True)
            seq = await store.queue_run(conn, s, NewRun(id="turn_1", kind="turn", prompt="a", snapshot={}),
                                        clock.now())
            first_holds.set()
            await release.wait()
            return seq

    a = asyncio.create_task(first())
    await first_holds.wait()
    b = asyncio.create_task(queue(store, clock, "ses_a", "turn_2"))
    await asyncio.sleep(0.3)
    assert not b.done()  # the second writer waits for the first one's lock
    release.set()
    assert (await a, await b) == (1, 2)


async def test_a_runs_status_is_read_for_turns_and_taskruns_and_none_when_there_is_no_such_run(store, clock):
    await make(store, clock, new_session("ses_a"))
    await queue(store, clock, "ses_a", "turn_1")
    await queue(store, clock, "ses_a", "tr_2", kind="task")
    await set_status(store.db, "tr_2", "running")
    async with store.db.read() as conn:
        assert await store.run_status(conn, "turn_1") == "queued"
        assert await store.run_status(conn, "tr_2") == "running"
        assert await store.run_status(conn, "turn_missing") is None


async def test_a_taskruns_id_names_no_turn(store, clock):
    await make(store, clock, new_session("ses_a"))
    await queue(store, clock, "ses_a", "turn_1")
    await queue(store, clock, "ses_a", "tr_2", kind="task")
    async with store.db.read() as conn:
        turn = await store.turn(conn, "turn_1")
        assert turn.session_id == "ses_a" and turn.turn_seq == 1 and turn.kind == "turn"
        assert await store.turn(conn, "tr_2") is None
        assert await store.turn(conn, "turn_missing") is None


async def test_recent_runs_are_the_sessions_last_ones_newest_seq_first(store, clock):
    await make(store, clock, new_session("ses_a"), new_session("ses_b"))
    for i in range(1, 5):
        await queue(store, clock, "ses_a", f"turn_{i}")
    await queue(store, clock, "ses_b", "turn_b")
    async with store.db.read() as conn:
        rows = await store.recent_runs(conn, "ses_a", 3)
        assert await store.recent_runs(conn, "ses_missing", 3) == []
    assert [(r.id, r.turn_seq, r.kind, r.status, r.result_text) for r in rows] == [
        ("turn_4", 4, "turn", "queued", None), ("turn_3", 3, "turn", "queued", None),
        ("turn_2", 2, "turn", "queued", None)]


async def test_a_delegation_parent_is_the_owners_session_with_its_running_run_of_highest_seq(store, clock):
    await make(store, clock, new_session("ses_a"))
    for i in range(1, 4):
        await queue(store, clock, "ses_a", f"turn_{i}")
    async with store.db.read() as conn:
        idle = await SqlSessionStore.delegation_parent(conn, "ses_a", "alice")
    assert (idle.session_id, idle.active_turn_id) == ("ses_a", None)
    assert (idle.engine, idle.model, idle.reasoning_effort) == ("scripted", "m1", "low")
    await set_status(store.db, "turn_1", "running")
    await set_status(store.db, "turn_2", "running")
    await set_status(store.db, "turn_3", "succeeded")
    async with store.db.read() as conn:
        assert (await SqlSessionStore.delegation_parent(conn, "ses_a", "alice")).active_turn_id == "turn_2"


async def test_a_delegation_never_takes_another_owners_session_as_its_parent(store, clock):
    await make(store, clock, new_session("ses_a"))
    await queue(store, clock, "ses_a", "turn_1")
    await set_status(store.db, "turn_1", "running")
    async with store.db.read() as conn:
        assert await SqlSessionStore.delegation_parent(conn, "ses_a", "bob") is None
        assert await SqlSessionStore.delegation_parent(conn, "ses_missing", "alice") is None


async def test_owned_sessions_are_the_owners_alone_most_recently_updated_first_and_at_most_limit(store, clock):
    await make(store, clock, new_session("ses_a"), new_session("ses_b"), new_session("ses_bob", "bob"))
    clock.advance(5)
    await make(store, clock, new_session("ses_c"))
    clock.advance(5)
    await queue(store, clock, "ses_a", "turn_1")  # a queued run makes ses_a the most recently updated
    async with store.db.read() as conn:
        rows = await store.owned(conn, "alice", 10)
        two = await store.owned(conn, "alice", 2)
        assert [r.id for r in await store.owned(conn, "bob", 10)] == ["ses_bob"]
        assert await store.owned(conn, "nobody", 10) == []
    assert [r.id for r in rows] == ["ses_a", "ses_c", "ses_b"]  # ses_b and ses_bob tie in time; bob's never shows
    assert [r.id for r in two] == ["ses_a", "ses_c"]
    assert (rows[0].turns, rows[0].kind, rows[0].engine, rows[0].model) == (1, "interactive", "scripted", "m1")
    assert utc(rows[0].updated_at) == clock.now() and "snapshot" not in {f.name for f in dataclasses.fields(rows[0])}


async def test_owned_sessions_tied_in_update_time_list_the_newest_id_first(store, clock):
    await make(store, clock, new_session("ses_1"), new_session("ses_3"), new_session("ses_2"))
    async with store.db.read() as conn:
        assert [r.id for r in await store.owned(conn, "alice", 10)] == ["ses_3", "ses_2", "ses_1"]


async def test_an_owned_sessions_runtime_is_its_sticky_runtimes_name_or_none(store, clock):
    await make(store, clock, new_session("ses_a", runtime_id="rt_1"), new_session("ses_b"),
               new_session("ses_c", runtime_id="rt_gone"))
    async with store.db.read() as conn:
        rows = {r.id: r.runtime for r in await store.owned(conn, "alice", 10)}
    assert rows == {"ses_a": "rt1", "ses_b": None, "ses_c": None}
