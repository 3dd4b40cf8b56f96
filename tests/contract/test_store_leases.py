"""hub/store/leases.py on both stores: one test per rule its methods state."""
from __future__ import annotations

from datetime import timedelta

import pytest

from hub.clock import ManualClock, utc
from hub.store.db import Connection, Database, Row
from hub.store.leases import SqlLeaseStore
from hub.store.tokens import SqlTokenStore
from tests.contract.races import race


@pytest.fixture
def leases(db: Database) -> SqlLeaseStore:
    """The lease store over each backend."""
    return SqlLeaseStore(db)


@pytest.fixture
async def alice(db: Database, clock: ManualClock) -> str:
    """Principal alice with token tok_a."""
    tokens = SqlTokenStore(db)
    async with db.write() as conn:
        pid = await tokens.ensure_principal(conn, "alice", "user", clock.now(), "pr_alice")
        await tokens.add_token(conn, token_id="tok_a", principal_id=pid, label="mcp:Claude", token_hash="h" * 64,
                               admin=False, kind="user", now=clock.now())
    return pid


async def open_task(leases: SqlLeaseStore, conn: Connection, clock: ManualClock, owner: str, task_id: str = "task_1",
                    secret_hash: str = "s" * 64) -> Row:
    return await leases.open_task(conn, task_id=task_id, owner_id=owner, name=task_id, holder_label="mcp:Claude",
                                  holder_token_id="tok_a", secret_hash=secret_hash, now=clock.now())


async def add_box(leases: SqlLeaseStore, conn: Connection, clock: ManualClock, box_id: str, task_id: str = "task_1",
                  live: bool = True) -> None:
    await leases.add_box(conn, box_id=box_id, task_id=task_id, name=None, driver="local",
                         provisional={"dir": box_id}, now=clock.now())
    if live:
        assert await leases.box_made(conn, box_id, {"dir": box_id, "sandbox": "bwrap"})


# ---------------------------------------------------------------- tasks


async def test_open_task_is_held_by_the_secret_hash_and_its_clocks_start_now(db, leases, alice, clock):
    async with db.write() as conn:
        row = await open_task(leases, conn, clock, alice)
    assert (row.status, row.secret_hash, row.holder_label, row.holder_token_id) == ("open", "s" * 64, "mcp:Claude",
                                                                                    "tok_a")
    assert utc(row.attached_at) == utc(row.last_activity_at) == utc(row.created_at) == clock.now()


async def test_task_with_lock_makes_a_second_attach_wait_for_the_first(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)

    async def attach(conn: Connection) -> str:
        await leases.task(conn, "task_1", lock=True)
        return (await leases.attach(conn, "task_1", secret_hash="n" * 64, holder_label="mcp:Codex",
                                    holder_token_id="tok_b", now=clock.now())).secret_hash

    async def read_locked(conn: Connection) -> str:
        return (await leases.task(conn, "task_1", lock=True)).secret_hash

    assert await race(db, attach, read_locked) == ("n" * 64, "n" * 64)
    async with db.read() as conn:
        assert await leases.task(conn, "task_missing") is None


async def test_task_with_live_boxes_reads_the_task_and_only_its_live_boxes_oldest_first(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await open_task(leases, conn, clock, alice, "task_2")
        await add_box(leases, conn, clock, "vm_b")
        clock.advance(1)
        await add_box(leases, conn, clock, "vm_a")
        await add_box(leases, conn, clock, "vm_gone")
        await leases.mark_destroyed(conn, "vm_gone", clock.now())
        await add_box(leases, conn, clock, "vm_making", live=False)
    async with db.read() as conn:
        task, live = await leases.task_with_live_boxes(conn, "task_1")
        empty, none = await leases.task_with_live_boxes(conn, "task_2")
        missing = await leases.task_with_live_boxes(conn, "task_missing")
    assert task.id == "task_1" and task.secret_hash == "s" * 64
    assert [b.id for b in live] == ["vm_b", "vm_a", "vm_making"]
    assert (live[0].state, live[0].handle, live[2].state) == ("live", {"dir": "vm_b", "sandbox": "bwrap"}, "creating")
    assert empty.id == "task_2" and none == [] and missing == (None, [])


async def test_task_with_box_reads_the_task_and_that_box_in_any_state_only_when_it_is_the_tasks(db, leases, alice,
                                                                                                clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await open_task(leases, conn, clock, alice, "task_2")
        await add_box(leases, conn, clock, "vm_a")
        await add_box(leases, conn, clock, "vm_gone")
        await leases.mark_destroyed(conn, "vm_gone", clock.now())
        await add_box(leases, conn, clock, "vm_other", "task_2")
    async with db.read() as conn:
        task, box = await leases.task_with_box(conn, "task_1", "vm_a")
        _, gone = await leases.task_with_box(conn, "task_1", "vm_gone")
        other_task, not_here = await leases.task_with_box(conn, "task_1", "vm_other")
        missing = await leases.task_with_box(conn, "task_missing", "vm_a")
    assert task.id == "task_1" and task.secret_hash == "s" * 64
    assert (box.id, box.task_id, box.state) == ("vm_a", "task_1", "live")
    assert box.handle == {"dir": "vm_a", "sandbox": "bwrap"}
    assert (gone.id, gone.state) == ("vm_gone", "destroyed")
    assert other_task.id == "task_1" and not_here is None and missing == (None, None)


async def test_touch_moves_activity_only_under_the_current_hash_of_an_open_task(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        start = clock.now()
        await leases.touch(conn, "task_1", "t" * 64, start + timedelta(minutes=5))
        assert utc((await leases.task(conn, "task_1")).last_activity_at) == start
        await leases.touch(conn, "task_1", "s" * 64, start + timedelta(minutes=6))
        assert utc((await leases.task(conn, "task_1")).last_activity_at) == start + timedelta(minutes=6)
        await leases.close(conn, "task_1", start + timedelta(minutes=7), "closed by mcp:Claude")
        await leases.touch(conn, "task_1", "s" * 64, start + timedelta(minutes=8))
        assert utc((await leases.task(conn, "task_1")).last_activity_at) == start + timedelta(minutes=6)


async def test_attach_mints_a_new_hash_restarts_the_clocks_and_forgets_a_release(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await leases.release(conn, "task_1", clock.now())
        clock.advance(minutes=40)
        row = await leases.attach(conn, "task_1", secret_hash="n" * 64, holder_label="mcp:Codex",
                                  holder_token_id="tok_b", now=clock.now())
    assert (row.secret_hash, row.holder_label, row.holder_token_id, row.released_at) == ("n" * 64, "mcp:Codex",
                                                                                         "tok_b", None)
    assert utc(row.attached_at) == utc(row.last_activity_at) == clock.now()


async def test_release_drops_the_hash_and_counts_as_activity(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        clock.advance(minutes=3)
        row = await leases.release(conn, "task_1", clock.now())
    assert (row.status, row.secret_hash, row.holder_label) == ("open", None, "mcp:Claude")
    assert utc(row.released_at) == utc(row.last_activity_at) == clock.now()


async def test_close_closes_the_task_with_its_reason_and_drops_the_hash(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await leases.close(conn, "task_1", clock.now(), "closed by mcp:Claude")
        row = await leases.task(conn, "task_1")
    assert (row.status, row.secret_hash, row.closed_reason, utc(row.closed_at)) == (
        "closed", None, "closed by mcp:Claude", clock.now())


async def test_close_quiet_closes_up_to_the_limit_quietest_first_and_leaves_active_tasks_open(db, leases, alice,
                                                                                             clock):
    async with db.write() as conn:
        for i in range(3):
            await open_task(leases, conn, clock, alice, f"task_{i}")
            clock.advance(minutes=1)
        await open_task(leases, conn, clock, alice, "task_busy")
        clock.advance(hours=4)
        cutoff = clock.now() - timedelta(hours=4, seconds=30)  # task_busy was active after it
        assert await leases.close_quiet(conn, cutoff, clock.now(), "quiet for 4 hours", 2) == 2
        states = {t: (await leases.task(conn, t)).status for t in ("task_0", "task_1", "task_2", "task_busy")}
        assert states == {"task_0": "closed", "task_1": "closed", "task_2": "open", "task_busy": "open"}
        assert (await leases.task(conn, "task_0")).closed_reason == "quiet for 4 hours"
        assert (await leases.task(conn, "task_0")).secret_hash is None
        assert await leases.close_quiet(conn, cutoff, clock.now(), "quiet for 4 hours", 10) == 1
        assert await leases.close_quiet(conn, cutoff, clock.now(), "quiet for 4 hours", 10) == 0


async def test_close_quiet_skips_a_task_another_transaction_holds_instead_of_waiting(db, leases, alice, clock):
    async with db.write() as conn:
        for t in ("task_held", "task_free"):
            await open_task(leases, conn, clock, alice, t)
    clock.advance(hours=5)
    cutoff = clock.now() - timedelta(hours=4)
    # An attach on another replica, mid-transaction (a read is no transaction: its lock would end at once).
    async with (db.read() if db.is_sqlite else db.write()) as holder:
        await leases.task(holder, "task_held", lock=True)
        async with db.write() as conn:
            closed = await leases.close_quiet(conn, cutoff, clock.now(), "quiet", 10)
    async with db.read() as conn:
        held = (await leases.task(conn, "task_held")).status
    # SQLite has one writer and no row locks: nothing is ever held there, so both close.
    assert (closed, held) == ((2, "closed") if db.is_sqlite else (1, "open"))


async def test_open_tasks_are_an_owners_open_ones_most_recently_active_first(db, leases, alice, clock):
    tokens = SqlTokenStore(db)
    async with db.write() as conn:
        bob = await tokens.ensure_principal(conn, "bob", "user", clock.now(), "pr_bob")
        await open_task(leases, conn, clock, alice, "task_old")
        clock.advance(1)
        await open_task(leases, conn, clock, alice, "task_new")
        await open_task(leases, conn, clock, alice, "task_shut")
        await leases.close(conn, "task_shut", clock.now(), "closed")
        await open_task(leases, conn, clock, bob, "task_bobs")
        assert [t.id for t in await leases.open_tasks(conn, alice)] == ["task_new", "task_old"]


async def test_recently_closed_are_the_newest_closed_tasks_up_to_the_limit(db, leases, alice, clock):
    async with db.write() as conn:
        for i in range(3):
            await open_task(leases, conn, clock, alice, f"task_{i}")
            await leases.close(conn, f"task_{i}", clock.now(), "closed")
            clock.advance(1)
        await open_task(leases, conn, clock, alice, "task_open")
        assert [t.id for t in await leases.recently_closed(conn, alice, 2)] == ["task_2", "task_1"]


async def seed_page(db: Database, leases: SqlLeaseStore, clock: ManualClock, owner: str) -> list[str]:
    """Open task_0 … task_6 for `owner`, one second apart except task_3 and task_4 (same instant); return them
    in page order (most recently active first, ties higher id first)."""
    async with db.write() as conn:
        for i in range(7):
            await open_task(leases, conn, clock, owner, f"task_{i}")
            if i != 3:
                clock.advance(1)
    return [f"task_{i}" for i in (6, 5, 4, 3, 2, 1, 0)]


def key(task) -> tuple:
    return utc(task.last_activity_at), task.id


async def test_open_tasks_page_is_the_most_recently_active_first_ties_by_higher_id_and_says_when_more_follow(
        db, leases, alice, clock):
    order = await seed_page(db, leases, clock, alice)
    async with db.read() as conn:
        first = await leases.open_tasks_page(conn, alice, 3)
        everything = await leases.open_tasks_page(conn, alice, 7)
        one_more = await leases.open_tasks_page(conn, alice, 6)
    assert [t.id for t in first.tasks] == order[:3] and first.more
    assert [t.id for t in everything.tasks] == order and not everything.more
    assert [t.id for t in one_more.tasks] == order[:6] and one_more.more


async def test_open_tasks_page_after_a_key_starts_below_it_and_stays_put_while_tasks_open_above(
        db, leases, alice, clock):
    order = await seed_page(db, leases, clock, alice)
    async with db.read() as conn:
        first = await leases.open_tasks_page(conn, alice, 3)
    async with db.write() as conn:
        clock.advance(60)
        await open_task(leases, conn, clock, alice, "task_newer")  # would shift an offset-based page
    async with db.read() as conn:
        second = await leases.open_tasks_page(conn, alice, 3, after=key(first.tasks[-1]))
        last = await leases.open_tasks_page(conn, alice, 3, after=key(second.tasks[-1]))
        beyond = await leases.open_tasks_page(conn, alice, 3, after=key(last.tasks[-1]))
    assert [t.id for t in second.tasks] == order[3:6] and second.more  # task_4 and task_3 tie: split by id
    assert [t.id for t in last.tasks] == order[6:] and not last.more
    assert beyond.tasks == [] and not beyond.more


async def test_open_tasks_page_before_a_key_reads_the_page_above_it_in_page_order(db, leases, alice, clock):
    order = await seed_page(db, leases, clock, alice)
    async with db.read() as conn:
        tasks = {t.id: t for t in (await leases.open_tasks_page(conn, alice, 7)).tasks}
        above_last = await leases.open_tasks_page(conn, alice, 3, before=key(tasks[order[6]]))
        above_that = await leases.open_tasks_page(conn, alice, 3, before=key(above_last.tasks[0]))
        top = await leases.open_tasks_page(conn, alice, 3, before=key(tasks[order[0]]))
    assert [t.id for t in above_last.tasks] == order[3:6] and above_last.more
    assert [t.id for t in above_that.tasks] == order[:3] and not above_that.more
    assert top.tasks == [] and not top.more


async def test_open_tasks_page_carries_only_the_live_boxes_of_its_tasks_oldest_first(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice, "task_a")
        clock.advance(1)
        await open_task(leases, conn, clock, alice, "task_b")
        await add_box(leases, conn, clock, "vm_b2", "task_b")
        clock.advance(1)
        await add_box(leases, conn, clock, "vm_b1", "task_b")
        await add_box(leases, conn, clock, "vm_making", "task_b", live=False)
        await add_box(leases, conn, clock, "vm_gone", "task_b")
        await leases.mark_destroyed(conn, "vm_gone", clock.now())
        await add_box(leases, conn, clock, "vm_a", "task_a")  # task_a is on the next page
    async with db.read() as conn:
        page = await leases.open_tasks_page(conn, alice, 1)
    assert [t.id for t in page.tasks] == ["task_b"] and page.more
    assert [(b.id, b.task_id, b.state) for b in page.boxes] == [("vm_b2", "task_b", "live"),
                                                               ("vm_b1", "task_b", "live"),
                                                               ("vm_making", "task_b", "creating")]


async def test_open_tasks_page_counts_every_open_task_of_the_owner_and_never_another_owners(
        db, leases, alice, clock):
    tokens = SqlTokenStore(db)
    async with db.write() as conn:
        bob = await tokens.ensure_principal(conn, "bob", "user", clock.now(), "pr_bob")
        await open_task(leases, conn, clock, alice, "task_a")
        await add_box(leases, conn, clock, "vm_a", "task_a")
        clock.advance(1)
        await open_task(leases, conn, clock, alice, "task_b")
        await open_task(leases, conn, clock, alice, "task_shut")
        await add_box(leases, conn, clock, "vm_shut", "task_shut")
        await leases.close(conn, "task_shut", clock.now(), "closed")
        clock.advance(1)
        await open_task(leases, conn, clock, bob, "task_bobs")
        await leases.add_box(conn, box_id="vm_bobs", task_id="task_bobs", name=None, driver="unsandboxed",
                             provisional={}, now=clock.now())
    async with db.read() as conn:
        page = await leases.open_tasks_page(conn, alice, 1)
        empty = await leases.open_tasks_page(conn, alice, 1, after=(clock.now() - timedelta(days=1), "task_0"))
        bobs = await leases.open_tasks_page(conn, bob, 10, after=(clock.now() + timedelta(days=1), "task_zzz"))
    assert [t.id for t in page.tasks] == ["task_b"] and page.boxes == [] and page.open_tasks == 2
    assert (empty.open_tasks, empty.tasks, empty.boxes) == (2, [], [])
    assert [t.id for t in bobs.tasks] == ["task_bobs"] and [b.id for b in bobs.boxes] == ["vm_bobs"]
    assert bobs.open_tasks == 1


# ---------------------------------------------------------------- boxes


async def test_live_boxes_of_open_tasks_are_an_owners_boxes_still_holding_resources(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await open_task(leases, conn, clock, alice, "task_shut")
        await add_box(leases, conn, clock, "vm_1")
        await add_box(leases, conn, clock, "vm_making", live=False)
        await add_box(leases, conn, clock, "vm_gone")
        await leases.mark_destroyed(conn, "vm_gone", clock.now())
        await add_box(leases, conn, clock, "vm_in_closed", "task_shut")
        await leases.close(conn, "task_shut", clock.now(), "closed")
        rows = await leases.live_boxes_of_open_tasks(conn, alice)
    assert sorted((r.id, r.task_id, r.state) for r in rows) == [("vm_1", "task_1", "live"),
                                                                ("vm_making", "task_1", "creating")]


async def test_live_box_ids_and_count_live_boxes_count_boxes_being_made_or_live(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await add_box(leases, conn, clock, "vm_1")
        clock.advance(1)
        await add_box(leases, conn, clock, "vm_2", live=False)
        await add_box(leases, conn, clock, "vm_3", live=False)
        await leases.box_failed(conn, "vm_3", clock.now())
        assert await leases.live_box_ids(conn, "task_1") == ["vm_1", "vm_2"]
        assert await leases.count_live_boxes(conn, "task_1") == 2


async def test_add_box_records_it_creating_with_its_provisional_handle(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await add_box(leases, conn, clock, "vm_1", live=False)
        box = await leases.box(conn, "vm_1")
    assert (box.state, box.handle, box.driver, box.destroyed_at) == ("creating", {"dir": "vm_1"}, "local", None)


async def test_box_made_marks_a_box_live_only_while_it_is_still_creating(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await add_box(leases, conn, clock, "vm_1", live=False)
        assert await leases.mark_destroyed(conn, "vm_1", clock.now())  # the task closed meanwhile
        assert await leases.box_made(conn, "vm_1", {"dir": "vm_1", "sandbox": "bwrap"}) is False
        box = await leases.box(conn, "vm_1")
    assert (box.state, box.handle) == ("destroyed", {"dir": "vm_1"})


async def test_box_failed_marks_the_box_failed(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await add_box(leases, conn, clock, "vm_1", live=False)
        await leases.box_failed(conn, "vm_1", clock.now())
        box = await leases.box(conn, "vm_1")
    assert (box.state, utc(box.destroyed_at)) == ("failed", clock.now())


async def test_mark_destroyed_is_true_once_for_a_box_being_made_or_live(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await add_box(leases, conn, clock, "vm_live")
        await add_box(leases, conn, clock, "vm_making", live=False)
        await add_box(leases, conn, clock, "vm_failed", live=False)
        await leases.box_failed(conn, "vm_failed", clock.now())
        assert [await leases.mark_destroyed(conn, b, clock.now()) for b in ("vm_live", "vm_making", "vm_failed")] == [
            True, True, False]
        assert await leases.mark_destroyed(conn, "vm_live", clock.now()) is False
        assert (await leases.box(conn, "vm_failed")).state == "failed"


async def test_box_reads_a_box_in_any_state_and_with_a_task_only_when_it_belongs_there(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        await open_task(leases, conn, clock, alice, "task_2")
        await add_box(leases, conn, clock, "vm_1")
        await leases.mark_destroyed(conn, "vm_1", clock.now())
        assert (await leases.box(conn, "vm_1")).state == "destroyed"
        assert (await leases.box(conn, "vm_1", "task_1")).id == "vm_1"
        assert await leases.box(conn, "vm_1", "task_2") is None
        assert await leases.box(conn, "vm_missing") is None


async def test_live_boxes_of_lists_the_boxes_of_these_tasks_still_holding_resources(db, leases, alice, clock):
    async with db.write() as conn:
        for t in ("task_1", "task_2", "task_3"):
            await open_task(leases, conn, clock, alice, t)
            await add_box(leases, conn, clock, f"vm_{t[-1]}", t)
            clock.advance(1)
        await add_box(leases, conn, clock, "vm_gone", "task_1")
        await leases.mark_destroyed(conn, "vm_gone", clock.now())
        assert [b.id for b in await leases.live_boxes_of(conn, ["task_1", "task_2"])] == ["vm_1", "vm_2"]


async def test_stuck_boxes_are_boxes_creating_since_the_cutoff_oldest_first_up_to_the_limit(db, leases, alice, clock):
    async with db.write() as conn:
        await open_task(leases, conn, clock, alice)
        for b in ("vm_1", "vm_2", "vm_3"):
            await add_box(leases, conn, clock, b, live=False)
            clock.advance(minutes=1)
        await add_box(leases, conn, clock, "vm_live")
        clock.advance(minutes=1)
        await add_box(leases, conn, clock, "vm_fresh", live=False)
        cutoff = clock.now() - timedelta(minutes=1)
        assert [b.id for b in await leases.stuck_boxes(conn, cutoff, 2)] == ["vm_1", "vm_2"]
        assert [b.id for b in await leases.stuck_boxes(conn, cutoff, 10)] == ["vm_1", "vm_2", "vm_3"]


async def test_closed_tasks_with_live_boxes_are_the_ones_a_closer_left_boxes_in(db, leases, alice, clock):
    async with db.write() as conn:
        for t in ("task_open", "task_left", "task_clean"):
            await open_task(leases, conn, clock, alice, t)
            await add_box(leases, conn, clock, f"vm_{t}", t)
            await add_box(leases, conn, clock, f"vm2_{t}", t)
        for t in ("task_left", "task_clean"):
            await leases.close(conn, t, clock.now(), "closed")
        for b in ("vm_task_clean", "vm2_task_clean"):
            await leases.mark_destroyed(conn, b, clock.now())
        assert await leases.closed_tasks_with_live_boxes(conn, 10) == ["task_left"]


# ---------------------------------------------------------------- Boxes page sessions


async def open_session(leases: SqlLeaseStore, conn: Connection, clock: ManualClock, owner: str,
                       session_id: str = "bxs_1", session_hash: str = "x" * 64) -> None:
    await leases.open_box_session(conn, session_id=session_id, principal_id=owner, token_id="tok_a",
                                  session_hash=session_hash, now=clock.now(),
                                  expires_at=clock.now() + timedelta(hours=12))


async def test_box_session_reads_the_session_with_its_principal_and_token(db, leases, alice, clock):
    async with db.write() as conn:
        await open_session(leases, conn, clock, alice)
        row = await leases.box_session(conn, "bxs_1")
        assert await leases.box_session(conn, "bxs_missing") is None
    assert (row.session_hash, row.name, row.label, row.kind, row.admin, row.token_revoked_at, row.revoked_at) == (
        "x" * 64, "alice", "mcp:Claude", "user", False, None, None)
    assert utc(row.expires_at) == clock.now() + timedelta(hours=12)


async def test_box_session_shows_the_revocation_of_the_token_that_opened_it(db, leases, alice, clock):
    async with db.write() as conn:
        await open_session(leases, conn, clock, alice)
        await SqlTokenStore(db).revoke_token(conn, "tok_a", clock.now())
        assert utc((await leases.box_session(conn, "bxs_1")).token_revoked_at) == clock.now()


async def test_revoke_box_session_ends_an_open_session_once_and_only_with_its_secret(db, leases, alice, clock):
    async with db.write() as conn:
        await open_session(leases, conn, clock, alice)
        assert await leases.revoke_box_session(conn, "bxs_1", "y" * 64, clock.now()) is False
        assert await leases.revoke_box_session(conn, "bxs_1", "x" * 64, clock.now()) is True
        assert await leases.revoke_box_session(conn, "bxs_1", "x" * 64, clock.now()) is False
        assert utc((await leases.box_session(conn, "bxs_1")).revoked_at) == clock.now()
