"""Lease tasks on every store backend: attach, takeover, the activity clock and the reaper."""
from __future__ import annotations

import asyncio
import hashlib

import pytest
import sqlalchemy as sa

from hub.boxes.local import LocalBoxDriver
from hub.clock import utc
from hub.config import BoxSettings, LeaseSettings
from hub.errors import AmuxError, Conflict, Invalid, NotFound, TooMany
from hub.services.auth.service import AuthService
from hub.services.leases.service import LeaseService
from hub.store.db import Database
from hub.store.tables import boxes, lease_tasks

# The store rules do not depend on isolation: plain processes keep these tests fast.
UNSANDBOXED = BoxSettings(driver="unsandboxed")


@pytest.fixture
async def leases(db, clock, tmp_path):
    """A LeaseService over each backend with a plain (unsandboxed) local box driver."""
    # No cap on open tasks here: the caps have tests of their own (the reaper tests open thirty).
    return LeaseService(db, clock, LeaseSettings(max_open_tasks_per_principal=0),
                        LocalBoxDriver(tmp_path / "boxes", UNSANDBOXED))


@pytest.fixture
async def alice(db, clock):
    auth = AuthService(db, clock)
    return await auth.authenticate(await auth.create_token("alice", label="mcp:Claude"))


@pytest.fixture
async def alice_codex(db, clock):
    auth = AuthService(db, clock)
    return await auth.authenticate(await auth.create_token("alice", label="mcp:Codex"))


@pytest.fixture
async def bob(db, clock):
    auth = AuthService(db, clock)
    return await auth.authenticate(await auth.create_token("bob", label="mcp:Claude"))


async def refusal(coro) -> AmuxError:
    with pytest.raises(AmuxError) as e:
        await coro
    return e.value


async def row_of(db: Database, task_id: str):
    async with db.read() as conn:
        return (await conn.execute(sa.select(lease_tasks).where(lease_tasks.c.id == task_id))).one()


async def test_only_the_secrets_sha256_is_stored_and_the_handle_is_shown_once(db, leases, alice):
    t = await leases.new(alice, "fix login")
    task_id, secret = t["handle"].split(".")
    assert task_id == t["task_id"] and task_id.startswith("task_") and len(task_id) <= 13
    row = await row_of(db, task_id)
    assert row.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in " ".join(str(v) for v in row)
    listed = await leases.list(alice)
    assert "handle" not in listed[0] and secret not in repr(listed)


async def test_the_id_alone_buys_nothing(leases, alice):
    t = await leases.new(alice, "work")
    e = await refusal(leases.vm_list(alice, t["task_id"]))
    assert isinstance(e, Invalid) and "rift_task_new" in e.message
    e = await refusal(leases.vm_list(alice, t["task_id"] + ".guessedsecret"))
    assert isinstance(e, Conflict) and e.message.startswith("held by mcp:Claude since ")


async def test_another_users_task_reads_the_same_as_a_missing_one(leases, alice, bob):
    t = await leases.new(alice, "mine")
    theirs = await refusal(leases.vm_list(bob, t["handle"]))
    missing = await refusal(leases.vm_list(bob, "task_zzzzzzzz.abc"))
    assert isinstance(theirs, NotFound) and theirs.message == missing.message.replace("task_zzzzzzzz", t["task_id"])
    assert "does not exist or is not yours" in theirs.message
    assert "does not exist or is not yours" in (await refusal(leases.attach(bob, t["task_id"], takeover=True))).message
    assert await leases.list(bob) == []


async def test_attach_on_a_lease_active_lately_is_refused_without_takeover(leases, alice, alice_codex, clock):
    t = await leases.new(alice, "work")
    clock.advance(minutes=29)
    e = await refusal(leases.attach(alice_codex, t["task_id"]))
    assert isinstance(e, Conflict)
    assert "held by mcp:Claude since 2026-01-05T09:00:00Z" in e.message and "takeover" in e.message
    assert (await leases.vm_list(alice, t["handle"])) == []  # the holder keeps working


async def test_attach_with_takeover_mints_a_new_secret_and_the_previous_handle_stops_working(leases, alice, alice_codex,
                                                                                             clock):
    t = await leases.new(alice, "work")
    clock.advance(minutes=1)
    a = await leases.attach(alice_codex, t["task_id"], takeover=True)
    assert a["handle"] != t["handle"] and a["holder"] == "mcp:Codex" and a["previous_holder"] == "mcp:Claude"
    assert await leases.vm_list(alice_codex, a["handle"]) == []
    e = await refusal(leases.vm_list(alice, t["handle"]))
    assert e.message == ("held by mcp:Codex since 2026-01-05T09:01:00Z; "
                         "`rift_task_attach` with takeover takes it over — tell the user")


async def test_exclusivity_is_by_possession_not_by_who_calls(leases, alice, alice_codex):
    t = await leases.new(alice, "work")
    # Another token of the same user (a sub-agent given the handle) shares the lease.
    assert await leases.vm_list(alice_codex, t["handle"]) == []
    # The same token re-attaching gets a new handle, and its own old one stops working.
    a = await leases.attach(alice, t["task_id"], takeover=True)
    assert isinstance(await refusal(leases.vm_list(alice, t["handle"])), Conflict)
    assert await leases.vm_list(alice, a["handle"]) == []


async def test_attach_on_a_lease_quiet_for_30_minutes_succeeds_without_takeover(leases, alice, alice_codex, clock):
    t = await leases.new(alice, "work")
    clock.advance(minutes=30)
    a = await leases.attach(alice_codex, t["task_id"])
    assert a["took_over"] and a["holder"] == "mcp:Codex"
    assert isinstance(await refusal(leases.vm_list(alice, t["handle"])), Conflict)


async def test_release_stops_the_handle_and_attach_takes_it_up_without_takeover(leases, alice, alice_codex):
    t = await leases.new(alice, "work")
    r = await leases.release(alice, t["handle"])
    assert r["held"] is False and r["holder"] is None and r["last_holder"] == "mcp:Claude"
    e = await refusal(leases.vm_list(alice, t["handle"]))
    assert e.message == (f"task {t['task_id']} was released and has no holder; `rift_task_attach {t['task_id']}` "
                         "takes it up")
    a = await leases.attach(alice_codex, t["task_id"])
    assert a["holder"] == "mcp:Codex" and not a["took_over"]


async def test_stored_activity_moves_at_most_once_a_minute(db, leases, alice, clock):
    t = await leases.new(alice, "work")
    start = utc((await row_of(db, t["task_id"])).last_activity_at)
    clock.advance(seconds=59)
    await leases.vm_list(alice, t["handle"])
    assert utc((await row_of(db, t["task_id"])).last_activity_at) == start
    clock.advance(seconds=1)
    await leases.vm_list(alice, t["handle"])
    assert utc((await row_of(db, t["task_id"])).last_activity_at) == clock.now()


async def test_a_stale_handle_is_not_activity(db, leases, alice, alice_codex, clock):
    t = await leases.new(alice, "work")
    await leases.attach(alice_codex, t["task_id"], takeover=True)
    clock.advance(minutes=10)
    await refusal(leases.vm_list(alice, t["handle"]))
    assert utc((await row_of(db, t["task_id"])).last_activity_at) == clock.now().replace(minute=0)


async def test_a_task_quiet_for_4_hours_closes_itself_and_its_boxes_are_destroyed(db, leases, alice, clock):
    t = await leases.new(alice, "work")
    box = await leases.vm_new(alice, t["handle"], "web")
    clock.advance(hours=4, seconds=-1)
    assert await leases.reap_once() == {"closed": 0, "destroyed": 0}
    clock.advance(seconds=1)
    assert await leases.reap_once() == {"closed": 1, "destroyed": 1}
    row = await row_of(db, t["task_id"])
    assert row.status == "closed" and row.closed_reason == "quiet for 4 h"
    async with db.read() as conn:
        state = (await conn.execute(sa.select(boxes.c.state).where(boxes.c.id == box["vm_id"]))).scalar_one()
        assert state == "destroyed"
    e = await refusal(leases.vm_list(alice, t["handle"]))
    assert "is closed (quiet for 4 h); its VMs are gone; `rift_task_new` opens another" in e.message


@pytest.mark.parametrize("quiet_s, reason", [(40, "quiet for 40 s"), (7500, "quiet for 2 h 5 min")])
async def test_the_close_reason_reads_as_a_duration_under_a_scaled_clock(db, clock, tmp_path, alice, quiet_s, reason):
    scaled = LeaseService(db, clock, LeaseSettings(auto_close_quiet_s=quiet_s),
                          LocalBoxDriver(tmp_path / "boxes", UNSANDBOXED))
    t = await scaled.new(alice, "work")
    clock.advance(seconds=quiet_s)
    assert (await scaled.reap_once())["closed"] == 1
    assert (await row_of(db, t["task_id"])).closed_reason == reason


async def test_a_touch_restarts_the_auto_close_timer(db, leases, alice, clock):
    t = await leases.new(alice, "work")
    clock.advance(hours=3)
    await leases.vm_list(alice, t["handle"])
    clock.advance(hours=3)
    assert (await leases.reap_once())["closed"] == 0
    clock.advance(hours=1)
    assert (await leases.reap_once())["closed"] == 1


async def test_closing_destroys_every_box_in_the_task(db, leases, alice):
    t = await leases.new(alice, "work")
    made = [(await leases.vm_new(alice, t["handle"], n))["vm_id"] for n in ("a", "b", "c")]
    closed = await leases.close(alice, t["handle"])
    assert closed["status"] == "closed" and sorted(closed["destroyed"]) == sorted(made)
    assert closed["closed_reason"] == "closed by mcp:Claude"
    async with db.read() as conn:
        states = (await conn.execute(sa.select(boxes.c.state).where(boxes.c.task_id == t["task_id"]))).scalars().all()
    assert states == ["destroyed"] * 3
    e = await refusal(leases.attach(alice, t["task_id"], takeover=True))
    assert "its VMs are gone; `rift_task_new` opens another" in e.message


async def test_a_box_belongs_to_exactly_one_task(leases, alice):
    one = await leases.new(alice, "one")
    two = await leases.new(alice, "two")
    box = await leases.vm_new(alice, one["handle"])
    assert box["task_id"] == one["task_id"]
    e = await refusal(leases.vm_exec(alice, two["handle"], box["vm_id"], "true"))
    assert isinstance(e, NotFound) and "rift_vm_list" in e.message
    assert [b["vm_id"] for b in await leases.vm_list(alice, one["handle"])] == [box["vm_id"]]
    assert await leases.vm_list(alice, two["handle"]) == []


async def test_the_reaper_destroys_live_boxes_left_in_a_closed_task(db, leases, alice):
    t = await leases.new(alice, "work")
    box = await leases.vm_new(alice, t["handle"])
    # A replica that closed the task died before destroying its boxes.
    async with db.write() as conn:
        await conn.execute(lease_tasks.update().where(lease_tasks.c.id == t["task_id"]).values(status="closed"))
    assert await leases.reap_once() == {"closed": 0, "destroyed": 1}
    async with db.read() as conn:
        state = (await conn.execute(sa.select(boxes.c.state).where(boxes.c.id == box["vm_id"]))).scalar_one()
        assert state == "destroyed"


async def test_reapers_on_several_replicas_close_each_quiet_task_once(db_url, leases, alice, clock, tmp_path):
    made = [(await leases.new(alice, f"t{i}"))["task_id"] for i in range(30)]
    clock.advance(hours=5)
    # PostgreSQL: independent replicas, each with its own pool. SQLite is the single-process embedded
    # store, so its "replicas" are concurrent reaper loops sharing the process's database.
    dbs = [leases.db if leases.db.is_sqlite else Database(db_url) for _ in range(3)]
    replicas = [LeaseService(d, clock, LeaseSettings(), LocalBoxDriver(tmp_path / "boxes", UNSANDBOXED)) for d in dbs]
    try:
        results = await asyncio.gather(*(r.reap_once() for r in replicas), leases.reap_once())
    finally:
        for d in dbs:
            if d is not leases.db:
                await d.close()
    assert sum(r["closed"] for r in results) == len(made)
    assert [(await row_of(leases.db, tid)).status for tid in made] == ["closed"] * len(made)


async def test_twenty_concurrent_takeovers_leave_exactly_one_working_handle(leases, alice, alice_codex):
    t = await leases.new(alice, "contested")
    results = await asyncio.gather(*(leases.attach(alice_codex, t["task_id"], takeover=True) for _ in range(20)))
    handles = [r["handle"] for r in results] + [t["handle"]]
    works = []
    for h in handles:
        try:
            await leases.vm_list(alice_codex, h)
            works.append(h)
        except Conflict:
            pass
    assert len(works) == 1


async def _half_made_box(db, leases, alice, clock):
    """Leave a box as a hub crash would: its row `creating` with the provisional handle, its driver half done."""
    t = await leases.new(alice, "crashy")
    box_id = "vm_halfmade" + t["task_id"][-4:]
    async with db.write() as conn:
        await conn.execute(boxes.insert().values(id=box_id, task_id=t["task_id"], driver=leases.driver.name,
                                                 state="creating", handle=leases.driver.provisional(box_id),
                                                 created_at=clock.now()))
    handle = await leases.driver.create(box_id)
    r = await leases.driver.exec(handle, "sleep 600 >/dev/null 2>&1 & echo $!", 5)
    return t, box_id, handle, int(r.stdout)


def _gone(pid: int) -> bool:
    import time
    from pathlib import Path

    for _ in range(200):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return True
        except OSError:
            return True
        time.sleep(0.01)
    return False


async def test_a_box_a_crash_left_creating_is_destroyed_through_the_driver_when_the_hub_comes_back(
        db, leases, alice, clock, tmp_path):
    t, box_id, handle, pid = await _half_made_box(db, leases, alice, clock)
    restarted = LeaseService(db, clock, LeaseSettings(), LocalBoxDriver(tmp_path / "boxes", UNSANDBOXED))
    # Fresh: another replica may still be making it, so it is left alone.
    assert await restarted.reap_once() == {"closed": 0, "destroyed": 0}
    clock.advance(minutes=3)
    assert await restarted.reap_once() == {"closed": 0, "destroyed": 1}
    async with db.read() as conn:
        assert (await conn.execute(sa.select(boxes.c.state).where(boxes.c.id == box_id))).scalar_one() == "destroyed"
    assert _gone(pid) and not (tmp_path / "boxes" / box_id).exists()


async def test_closing_a_task_destroys_a_box_still_being_made_through_the_driver(db, leases, alice, clock, tmp_path):
    t, box_id, handle, pid = await _half_made_box(db, leases, alice, clock)
    closed = await leases.close(alice, t["handle"])
    assert closed["destroyed"] == [box_id]
    assert _gone(pid) and not (tmp_path / "boxes" / box_id).exists()


async def test_a_task_holds_any_number_of_boxes_by_default_and_the_per_user_quota_is_the_limit(db, clock, alice,
                                                                                                tmp_path):
    assert BoxSettings().max_per_task == 0 and BoxSettings().max_live_per_principal == 8
    unlimited = BoxSettings(driver="unsandboxed", max_live_per_principal=0)
    many = LeaseService(db, clock, LeaseSettings(), LocalBoxDriver(tmp_path / "boxes", unlimited), unlimited)
    t = await many.new(alice, "many")
    for _ in range(40):  # well past any small fixed cap
        await many.vm_new(alice, t["handle"])
    assert len(await many.vm_list(alice, t["handle"])) == 40
    quota = BoxSettings(driver="unsandboxed")
    capped = LeaseService(db, clock, LeaseSettings(), LocalBoxDriver(tmp_path / "boxes", quota), quota)
    e = await refusal(capped.vm_new(alice, t["handle"]))
    assert isinstance(e, TooMany) and "boxes.max_live_per_principal = 8" in e.message


async def test_the_number_of_boxes_per_task_is_the_configured_safety_cap(db, clock, alice, tmp_path):
    capped = LeaseService(db, clock, LeaseSettings(), LocalBoxDriver(tmp_path / "boxes", UNSANDBOXED),
                          BoxSettings(driver="unsandboxed", max_per_task=2))
    t = await capped.new(alice, "many")
    for _ in range(2):
        await capped.vm_new(alice, t["handle"])
    e = await refusal(capped.vm_new(alice, t["handle"]))
    assert isinstance(e, Conflict) and "boxes.max_per_task" in e.message and "rift_vm_destroy" in e.message


async def test_without_bubblewrap_rift_vm_new_refuses_with_the_fix_and_leaves_nothing(db, clock, alice, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # checked at each creation: bwrap is not found now
    sandboxed = LeaseService(db, clock, LeaseSettings(), LocalBoxDriver(tmp_path / "boxes", BoxSettings()))
    t = await sandboxed.new(alice, "no bwrap")
    e = await refusal(sandboxed.vm_new(alice, t["handle"]))
    assert isinstance(e, Invalid)
    assert "apt-get install bubblewrap" in e.message and 'boxes.driver = "unsandboxed"' in e.message
    async with db.read() as conn:
        assert (await conn.execute(sa.select(boxes.c.state))).scalars().all() == ["failed"]
    assert list((tmp_path / "boxes").iterdir()) == []


async def _on_replicas(db_url: str, db: Database, clock, tmp_path, leases: LeaseSettings,
                       boxes_: BoxSettings) -> tuple[list[LeaseService], list[Database]]:
    """Return three lease services sharing one database as replicas do (on SQLite: one process's database)."""
    dbs = [db if db.is_sqlite else Database(db_url) for _ in range(3)]
    return [LeaseService(d, clock, leases, LocalBoxDriver(tmp_path / "boxes", boxes_), boxes_) for d in dbs], dbs


async def test_replicas_opening_tasks_at_once_never_pass_the_per_principal_cap_together(db_url, db, clock, alice,
                                                                                         tmp_path):
    replicas, dbs = await _on_replicas(db_url, db, clock, tmp_path, LeaseSettings(max_open_tasks_per_principal=3),
                                       UNSANDBOXED)
    try:
        results = await asyncio.gather(*(replicas[i % 3].new(alice, f"t{i}") for i in range(12)),
                                       return_exceptions=True)
    finally:
        for d in dbs:
            if d is not db:
                await d.close()
    assert sum(isinstance(r, dict) for r in results) == 3
    assert all(isinstance(r, TooMany) and "leases.max_open_tasks_per_principal" in r.message
               for r in results if not isinstance(r, dict))


async def test_replicas_claiming_boxes_at_once_never_pass_the_per_principal_cap_together(db_url, db, clock, alice,
                                                                                         tmp_path):
    capped = BoxSettings(driver="unsandboxed", max_live_per_principal=4)
    replicas, dbs = await _on_replicas(db_url, db, clock, tmp_path, LeaseSettings(), capped)
    try:
        handles = [(await replicas[0].new(alice, f"t{i}"))["handle"] for i in range(3)]
        results = await asyncio.gather(*(replicas[i % 3].vm_new(alice, handles[i % 3]) for i in range(12)),
                                       return_exceptions=True)
    finally:
        for d in dbs:
            if d is not db:
                await d.close()
    assert sum(isinstance(r, dict) for r in results) == 4
    assert all(isinstance(r, TooMany) and "boxes.max_live_per_principal" in r.message
               for r in results if not isinstance(r, dict))
