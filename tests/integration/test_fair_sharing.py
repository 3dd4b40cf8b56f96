"""Fair sharing: no principal's backlog starves another's work; limits name their setting; waiting says why."""
from __future__ import annotations

import re
from pathlib import Path

import httpx2
import pytest
import sqlalchemy as sa

from hub.config_sources import load_settings
from hub.domain import schedule_rules as rules
from hub.errors import Invalid
from hub.runner import protocol as p
from hub.services.tasks.admission import SubmitRequest
from hub.store.tables import runtimes, task_runs
from tests.helpers import eventually, mcp_client, start_hub

LONG = "sleep 30\nsay done"


async def statuses(hub, ids: list[str]) -> list[str]:
    async with hub.hub.db.read() as conn:
        rows = dict((await conn.execute(sa.select(task_runs.c.id, task_runs.c.status)
                                        .where(task_runs.c.id.in_(ids)))).all())
    return [rows[i] for i in ids]


@pytest.fixture
async def quiet_hub(db_url: str, tmp_path: Path, clock):
    """A hub without its loops: each placement pass is run by the test."""
    handle = await start_hub(db_url, tmp_path, clock, background=False)
    yield handle
    await handle.stop()


async def test_dispatch_places_one_users_first_task_before_another_users_backlog(quiet_hub):
    hub = quiet_hub
    await hub.start_runner(slots=2)
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    bob = await hub.hub.auth.authenticate(await hub.token("bob"))
    flood = [(await hub.hub.tasks.submit(alice, SubmitRequest(prompt=LONG, profile="scripted")))["task_id"]
             for _ in range(40)]
    mine = (await hub.hub.tasks.submit(bob, SubmitRequest(prompt=LONG, profile="scripted")))["task_id"]
    assert await hub.hub.dispatcher.place_once() == 2
    assert (await statuses(hub, [mine]))[0] in ("dispatched", "running")  # bob did not wait behind 40 tasks
    assert sum(s != "queued" for s in await statuses(hub, flood)) == 1


async def test_a_principal_with_runs_yields_to_one_without(quiet_hub):
    hub = quiet_hub
    await hub.start_runner(slots=3)
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    bob = await hub.hub.auth.authenticate(await hub.token("bob"))
    first = [(await hub.hub.tasks.submit(alice,
                                         SubmitRequest(prompt=LONG, profile="scripted")))["task_id"] for _ in range(2)]
    assert await hub.hub.dispatcher.place_once() == 2  # alice now runs two
    later = [(await hub.hub.tasks.submit(alice,
                                         SubmitRequest(prompt=LONG, profile="scripted")))["task_id"] for _ in range(3)]
    bobs = (await hub.hub.tasks.submit(bob, SubmitRequest(prompt=LONG, profile="scripted")))["task_id"]
    assert await hub.hub.dispatcher.place_once() == 1
    assert (await statuses(hub, [bobs]))[0] != "queued" and set(await statuses(hub, later)) == {"queued"}
    assert first


async def test_max_running_per_principal_holds_a_users_next_task_while_others_run(db_url, tmp_path, clock):
    hub = await start_hub(db_url, tmp_path, clock, background=False, max_running_per_principal=1)
    try:
        await hub.start_runner(slots=4)
        alice = await hub.hub.auth.authenticate(await hub.token("alice"))
        bob = await hub.hub.auth.authenticate(await hub.token("bob"))
        a = [(await hub.hub.tasks.submit(alice,
                                         SubmitRequest(prompt=LONG, profile="scripted")))["task_id"] for _ in range(3)]
        b = (await hub.hub.tasks.submit(bob, SubmitRequest(prompt=LONG, profile="scripted")))["task_id"]
        assert await hub.hub.dispatcher.place_once() == 2
        assert (await statuses(hub, a)).count("queued") == 2 and (await statuses(hub, [b]))[0] != "queued"
        # an admin token's principal is exempt
        root = await hub.hub.auth.authenticate(await hub.token("root", admin=True))
        r = [(await hub.hub.tasks.submit(root,
                                         SubmitRequest(prompt=LONG, profile="scripted")))["task_id"] for _ in range(2)]
        assert await hub.hub.dispatcher.place_once() == 2
        assert "queued" not in await statuses(hub, r)
    finally:
        await hub.stop()


def test_the_operator_running_cap_is_off_by_default_so_the_fair_share_governs():
    assert load_settings(env={}).hub.max_running_per_principal == 0
    assert load_settings(env={"AMUX_HUB__MAX_RUNNING_PER_PRINCIPAL": "3"}).hub.max_running_per_principal == 3


async def test_max_queued_per_principal_refuses_naming_the_limit_and_the_setting(db_url, tmp_path, clock):
    hub = await start_hub(db_url, tmp_path, clock, background=False, max_queued_per_principal=2)
    try:
        await hub.start_runner(slots=1)
        token = await hub.token("alice")
        async with mcp_client(hub.url, token) as c:
            for _ in range(2):
                assert not (await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted"})).is_error
            res = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted"})
        assert res.is_error and "hub.max_queued_per_principal = 2" in res.content[0].text
        async with __import__("httpx2").AsyncClient() as http:
            resp = await http.post(f"{hub.url}/api/v1/tasks", json={"prompt": "say hi", "profile": "scripted"},
                                   headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 429 and "max_queued_per_principal" in resp.text
        # admins are exempt
        async with mcp_client(hub.url, hub.admin_token) as c:
            for _ in range(3):
                assert not (await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted"})).is_error
    finally:
        await hub.stop()


async def test_a_task_pinned_to_an_offline_runtime_says_why_it_waits_and_fails_not_placed_after_the_queue_timeout(
        quiet_hub):
    hub = quiet_hub
    await hub.start_runner(name="gpu-box", slots=1)
    alice = await hub.hub.auth.authenticate(hub.admin_token)
    async with hub.hub.db.write() as conn:
        await conn.execute(runtimes.update().where(runtimes.c.name == "gpu-box").values(status="offline"))
    task_id = (await hub.hub.tasks.submit(alice, SubmitRequest(prompt="say hi", profile="scripted",
                                                               runtime="gpu-box")))["task_id"]
    view = await hub.hub.tasks.get(alice, task_id)
    assert view["status"] == "queued" and view["waiting_for"].startswith("waiting for runtime gpu-box, offline since")
    hub.clock.advance(hub.hub.settings.hub.queue_timeout_s - 5)
    await hub.hub.dispatcher.reap_once()
    assert (await hub.hub.tasks.get(alice, task_id))["status"] == "queued"  # not yet
    hub.clock.advance(10)
    counts = await hub.hub.dispatcher.reap_once()
    view = await hub.hub.tasks.get(alice, task_id)
    assert counts["not_placed"] == 1 and view["status"] == "failed"
    assert re.match(r"not placed: waiting for runtime gpu-box, (offline|lost) since 2026-",
                    view["error"]), view["error"]


async def test_a_queued_task_waiting_only_for_a_slot_is_never_failed_by_the_queue_timeout(quiet_hub):
    hub = quiet_hub
    await hub.start_runner(slots=1)
    alice = await hub.hub.auth.authenticate(hub.admin_token)
    ids = [(await hub.hub.tasks.submit(alice,
                                       SubmitRequest(prompt=LONG, profile="scripted")))["task_id"] for _ in range(2)]
    await hub.hub.dispatcher.place_once()

    async def started() -> bool:  # the runner committed its reservation: nothing of it can expire any more
        return (await statuses(hub, ids[:1]))[0] == "running"

    await eventually(started)
    view = await hub.hub.tasks.get(alice, ids[1])
    assert view["waiting_for"] == "waiting for a free slot (1 eligible runtime(s) online, all busy)"
    now = hub.clock.advance(hub.hub.settings.hub.queue_timeout_s + 60)
    async with hub.hub.db.write() as conn:  # the runner's heartbeat, as it would arrive at the advanced time
        await conn.execute(runtimes.update().values(last_seen_at=now))
    await hub.hub.dispatcher.reap_once()
    assert (await statuses(hub, ids[1:]))[0] == "queued"


def test_schedules_shorter_than_the_60s_minimum_interval_are_refused_naming_the_setting():
    settings = load_settings(env={})
    assert settings.schedules.min_interval_s == 60
    with pytest.raises(Invalid) as e:
        rules.check_min_interval(rules.parse("every 1s", "UTC"), settings.schedules.min_interval_s)
    assert "schedules.min_interval_s" in e.value.message and "AMUX_SCHEDULES__MIN_INTERVAL_S" in e.value.message
    rules.check_min_interval(rules.parse("every 1m", "UTC"), settings.schedules.min_interval_s)
    lowered = load_settings(env={"AMUX_SCHEDULES__MIN_INTERVAL_S": "1"})
    rules.check_min_interval(rules.parse("every 1s", "UTC"), lowered.schedules.min_interval_s)


async def test_schedule_create_over_mcp_refuses_every_1s_on_a_default_hub(db_url, tmp_path, clock):
    hub = await start_hub(db_url, tmp_path, clock, background=False)
    hub.hub.schedules.settings.min_interval_s = 60.0  # the shipped default (test hubs lower it)
    try:
        await hub.start_runner()
        async with mcp_client(hub.url, hub.admin_token) as c:
            res = await c.call_tool("schedule_create", {"name": "x", "prompt": "say hi", "rule": "every 1s",
                                                        "profile": "scripted"})
        assert res.is_error and "schedules.min_interval_s" in res.content[0].text
    finally:
        await hub.stop()


@pytest.mark.parametrize("text", ["every 99999999999999999999d", "every 3651d", "every 999999999999h"])
def test_interval_rules_past_ten_years_are_refused_not_an_overflow(text):
    with pytest.raises(Invalid) as e:
        rules.parse(text, "UTC")
    assert "`at` rule" in e.value.message


async def test_concurrent_submissions_share_one_commit_and_the_queue_limit_counts_them_in_order(
        db_url, tmp_path, clock):
    """Group commit: submissions that arrive together are inserted by one transaction, each caller gets its own
    task, and `hub.max_queued_per_principal` refuses exactly the ones beyond the limit (in the order they reached
    the commit), as one by one."""
    import asyncio

    from hub.errors import TooMany

    hub = await start_hub(db_url, tmp_path, clock, background=False, max_queued_per_principal=3)
    try:
        await hub.start_runner(slots=1)  # no placement loop: what is admitted stays queued
        alice = await hub.hub.auth.authenticate(await hub.token("alice"))
        bob = await hub.hub.auth.authenticate(await hub.token("bob"))
        req = SubmitRequest(prompt="say hi", profile="scripted")
        outcomes = await asyncio.gather(*(hub.hub.tasks.submit(who, req) for who in [alice] * 5 + [bob] * 2),
                                        return_exceptions=True)
        refused = [o for o in outcomes if isinstance(o, TooMany)]
        ids = [o["task_id"] for o in outcomes if isinstance(o, dict)]
        assert len(refused) == 2 and all("hub.max_queued_per_principal = 3" in e.message for e in refused)
        assert sum(isinstance(o, TooMany) for o in outcomes[:5]) == 2  # alice's beyond 3; bob's two are admitted
        assert len(set(ids)) == 5 and await statuses(hub, ids) == ["queued"] * 5
    finally:
        await hub.stop()


async def test_schedule_made_tasks_count_in_the_queue_limit_and_a_refused_fire_shows_the_429_fix_in_history(
        db_url, tmp_path, clock):
    hub = await start_hub(db_url, tmp_path, clock, background=False, max_queued_per_principal=1)
    try:
        await hub.start_runner(slots=1)  # online, so a fire is admitted (placement is left to the test: none runs)
        token = await hub.token("alice")
        async with mcp_client(hub.url, token) as c:
            sids = [(await c.call_tool("schedule_create", {"name": f"s{i}", "prompt": "say hi", "rule": "every 1m",
                                                           "profile": "scripted"})).structured_content["schedule_id"]
                    for i in range(2)]
            clock.advance(60)
            assert await hub.hub.schedule_firing.fire_due() == 2
            rows = [(await c.call_tool("schedule_history", {"schedule_id": s})).structured_content["firings"][0]
                    for s in sids]
        async with httpx2.AsyncClient(base_url=hub.url, headers={"Authorization": f"Bearer {token}"}) as http:
            refusal = await http.post("/api/v1/tasks", json={"prompt": "say hi", "profile": "scripted"})
        assert refusal.status_code == 429 and refusal.json()["error"] == "limit_reached"
        assert sorted(r["admission"] for r in rows) == ["error:limit_reached: " + refusal.json()["fix"], "ok"]
        assert [r["task_id"] is None for r in sorted(rows, key=lambda r: r["admission"])] == [True, False]
    finally:
        await hub.stop()


async def test_submissions_that_arrive_while_a_commit_runs_are_inserted_together_by_the_next_one(db, clock):
    """The group commit's rule, deterministically: the first submission's transaction is held open while three more
    arrive; they are inserted by one next transaction, and each caller is answered after its own commit."""
    import asyncio
    import threading

    from hub.services.tasks.service import Admit, _GroupCommit
    from hub.store.tasks import QueuedTask

    release, batches = threading.Event(), []

    async def apply(conn, batch):
        batches.append([a.task.task_id for a in batch])
        if len(batches) == 1:  # hold the transaction open: on SQLite its body runs on the database's writer thread
            if db.is_sqlite:
                release.wait(30)
            else:
                await asyncio.to_thread(release.wait, 30)
        return {}

    group = _GroupCommit(db, apply, lambda: None)
    item = lambda i: Admit(exempt=True, task=QueuedTask(task_id=f"t{i}", owner_id="p", name=None, prompt="x",  # noqa: E731
                                                        snapshot={}, now=clock.now()))
    first = asyncio.ensure_future(group.admit(item(0)))
    while not batches:
        await asyncio.sleep(0.01)
    rest = [asyncio.ensure_future(group.admit(item(i))) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    assert not any(t.done() for t in [first, *rest])  # nobody is answered before its commit
    release.set()
    await asyncio.gather(first, *rest)
    assert batches == [["t0"], ["t1", "t2", "t3"]]


# --- the fair share: work-conserving, never pre-empting, reached as runs end ---------------------------------------

HOURS = "sleep 3000\nsay done"  # a run that holds its slot until it is cancelled


async def submit_over_mcp(c, n: int) -> list[str]:
    """Submit `n` hour-long scripted tasks through the MCP client `c`; return their ids."""
    ids = []
    for _ in range(n):
        res = await c.call_tool("task_submit", {"prompt": HOURS, "profile": "scripted"})
        assert not res.is_error, res.content[0].text
        ids.append(res.structured_content["task_id"])
    return ids


async def end_one(hub, c, task_id: str) -> None:
    """Cancel a running task over MCP and wait until its slot is free again (its run ended on the runner)."""
    assert not (await c.call_tool("task_cancel", {"task_id": task_id})).is_error

    async def ended() -> bool:
        return (await statuses(hub, [task_id]))[0] == "cancelled"

    await eventually(ended)


async def on_runtime(hub, ids: list[str]) -> int:
    return sum(s in ("dispatched", "running") for s in await statuses(hub, ids))


async def test_alone_one_user_uses_every_slot(db_url, tmp_path, clock):
    hub = await start_hub(db_url, tmp_path, clock)
    try:
        await hub.start_runner(slots=4)
        async with mcp_client(hub.url, await hub.token("alice")) as alice:
            mine = await submit_over_mcp(alice, 6)
            await eventually(lambda: _equals(on_runtime(hub, mine), 4))
        assert (await statuses(hub, mine)).count("queued") == 2  # the runtime is full: the rest wait for a slot
    finally:
        await hub.stop()


async def _equals(value, expected) -> bool:
    return await value == expected


async def test_a_second_user_takes_each_slot_that_frees_until_both_hold_their_fair_share(db_url, tmp_path, clock):
    """Alice fills the runtime alone; Bob waits only until a run ends, and Alice gets no slot back while Bob is
    below his share (ceil(4 slots / 2 users) = 2); once Bob has no work waiting, Alice may use a freed slot."""
    hub = await start_hub(db_url, tmp_path, clock)
    try:
        await hub.start_runner(slots=4)
        async with mcp_client(hub.url, await hub.token("alice")) as alice, \
                mcp_client(hub.url, await hub.token("bob")) as bob:
            a = await submit_over_mcp(alice, 8)
            await eventually(lambda: _equals(on_runtime(hub, a), 4))
            b = await submit_over_mcp(bob, 2)
            await hub.hub.dispatcher.place_once()
            assert await statuses(hub, b) == ["queued", "queued"]  # running tasks are never pre-empted
            held = [t for t, s in zip(a, await statuses(hub, a)) if s != "queued"]
            await end_one(hub, alice, held[0])
            await eventually(lambda: _equals(on_runtime(hub, b), 1))
            await end_one(hub, alice, held[1])
            await eventually(lambda: _equals(on_runtime(hub, b), 2))
            assert await on_runtime(hub, a) == 2  # alice got neither freed slot back while bob waited
            assert (await statuses(hub, a)).count("queued") == 4
            await end_one(hub, bob, b[0])  # bob has nothing left to run: alice may use his freed slot
            await eventually(lambda: _equals(on_runtime(hub, a), 3))
    finally:
        await hub.stop()


async def test_runs_on_a_principals_own_runtime_do_not_count_against_its_share_of_a_shared_one(
        db_url, tmp_path, clock):
    """Bob keeps three runs on his own runtime and waits for the shared one; Alice holds both shared slots. When one
    of hers ends she is at her share of the shared runtime (ceil(2 / 2) = 1) and Bob below his: the slot is Bob's,
    although he runs more tasks in all."""
    hub = await start_hub(db_url, tmp_path, clock)
    try:
        await hub.start_runner(name="shared", slots=2)
        await hub.start_runner(name="bob-box", slots=3, token=await hub.hub.auth.create_token("bob", runner=True))
        async with mcp_client(hub.url, await hub.token("alice")) as alice, \
                mcp_client(hub.url, await hub.token("bob")) as bob:
            own = []
            for _ in range(3):
                res = await bob.call_tool("task_submit", {"prompt": HOURS, "profile": "scripted",
                                                          "runtime": "bob-box"})
                own.append(res.structured_content["task_id"])
            await eventually(lambda: _equals(on_runtime(hub, own), 3))
            a = await submit_over_mcp(alice, 3)  # only the shared runtime takes alice's tasks
            await eventually(lambda: _equals(on_runtime(hub, a), 2))
            res = await bob.call_tool("task_submit", {"prompt": HOURS, "profile": "scripted", "runtime": "shared"})
            wants_shared = res.structured_content["task_id"]
            held = [t for t, s in zip(a, await statuses(hub, a)) if s != "queued"]
            await end_one(hub, alice, held[0])
            await eventually(lambda: _equals(on_runtime(hub, [wants_shared]), 1))
            assert (await statuses(hub, a)).count("queued") == 1
    finally:
        await hub.stop()


async def test_a_backlog_pinned_to_a_principals_busy_runtime_does_not_hold_back_its_share_of_a_shared_one(
        db_url, tmp_path, clock):
    """Bob's oldest tasks wait for his own busy runtime; his newest could run on the shared one. When Alice's run
    there ends, Bob's task is seen (each runtime a principal names has a queue of its own) and takes the slot."""
    hub = await start_hub(db_url, tmp_path, clock)
    try:
        await hub.start_runner(name="shared", slots=2)
        await hub.start_runner(name="bob-box", slots=1, token=await hub.hub.auth.create_token("bob", runner=True))
        async with mcp_client(hub.url, await hub.token("alice")) as alice, \
                mcp_client(hub.url, await hub.token("bob")) as bob:
            pinned = []
            for _ in range(6):
                res = await bob.call_tool("task_submit", {"prompt": HOURS, "profile": "scripted",
                                                          "runtime": "bob-box"})
                pinned.append(res.structured_content["task_id"])
            await eventually(lambda: _equals(on_runtime(hub, pinned), 1))
            a = await submit_over_mcp(alice, 4)
            await eventually(lambda: _equals(on_runtime(hub, a), 2))
            res = await bob.call_tool("task_submit", {"prompt": HOURS, "profile": "scripted", "runtime": "shared"})
            wants_shared = res.structured_content["task_id"]
            await end_one(hub, alice, next(t for t, s in zip(a, await statuses(hub, a)) if s != "queued"))
            await eventually(lambda: _equals(on_runtime(hub, [wants_shared]), 1))
            assert await on_runtime(hub, a) == 1
    finally:
        await hub.stop()


async def test_a_free_slot_is_not_left_idle_while_a_task_that_fits_waits_behind_its_owners_that_cannot_start(
        quiet_hub):
    hub = quiet_hub
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    caps = {"platform": "linux", "engines": ["claude"], "workspace_root": "/tmp", "workspace_writable": True}
    await hub.hub.registry.register(admin, p.Register(name="claude-box", slots=1, capabilities=caps))
    async with hub.hub.db.write() as conn:  # the only runtime offering claude is offline: claude tasks wait
        await conn.execute(runtimes.update().where(runtimes.c.name == "claude-box").values(status="offline"))
    await hub.start_runner(name="r1", slots=1)
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    stuck = [(await hub.hub.tasks.submit(alice, SubmitRequest(prompt="hello", profile="claude")))["task_id"]
             for _ in range(8)]
    fits = (await hub.hub.tasks.submit(alice, SubmitRequest(prompt=LONG, profile="scripted")))["task_id"]
    assert await hub.hub.dispatcher.place_once() == 1
    assert (await statuses(hub, [fits]))[0] != "queued" and set(await statuses(hub, stuck)) == {"queued"}


async def test_a_sessions_later_turn_never_starts_before_the_earlier_one_that_gave_way_to_the_fair_share(quiet_hub):
    """Alice holds her share (2 of the shared runtime's 4 slots) and queues two turns of one session; Bob, below
    his share there, waits between them. The first turn gives way to Bob; the second must not take the slot that
    is left before it: the first one takes it."""
    hub = quiet_hub
    await hub.start_runner(name="shared", slots=4)
    await hub.start_runner(name="bob-box", slots=2, token=await hub.hub.auth.create_token("bob", runner=True))
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    bob = await hub.hub.auth.authenticate(await hub.token("bob"))
    for _ in range(2):
        await hub.hub.tasks.submit(bob, SubmitRequest(prompt=HOURS, profile="scripted", runtime="bob-box"))
        await hub.hub.tasks.submit(alice, SubmitRequest(prompt=HOURS, profile="scripted"))
    assert await hub.hub.dispatcher.place_once() == 4
    sid = (await hub.hub.sessions.create(alice, profile="scripted"))["session_id"]
    hub.clock.advance(1)  # queued in this order: first turn, Bob's task, second turn
    first = await hub.hub.sessions.submit_turn(alice, sid, HOURS)
    hub.clock.advance(1)
    bobs = (await hub.hub.tasks.submit(bob, SubmitRequest(prompt=HOURS, profile="scripted",
                                                          runtime="shared")))["task_id"]
    hub.clock.advance(1)
    second = await hub.hub.sessions.submit_turn(alice, sid, HOURS)
    assert await hub.hub.dispatcher.place_once() == 2
    assert await statuses(hub, [first, bobs, second]) == ["dispatched", "dispatched", "queued"]


async def test_a_task_does_not_wait_behind_its_owners_turns_that_wait_for_their_sessions_running_turn(quiet_hub):
    hub = quiet_hub
    await hub.start_runner(slots=2)
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    sid = (await hub.hub.sessions.create(alice, profile="scripted"))["session_id"]
    running = await hub.hub.sessions.submit_turn(alice, sid, HOURS)
    assert await hub.hub.dispatcher.place_once() == 1
    turns = []
    for _ in range(5):
        hub.clock.advance(1)
        turns.append(await hub.hub.sessions.submit_turn(alice, sid, HOURS))
    hub.clock.advance(1)
    task = (await hub.hub.tasks.submit(alice, SubmitRequest(prompt=HOURS, profile="scripted")))["task_id"]
    assert await hub.hub.dispatcher.place_once() == 1
    assert (await statuses(hub, [running, task]))[1] == "dispatched"
    assert set(await statuses(hub, turns)) == {"queued"}  # one run at a time per session


async def test_an_admins_backlog_is_held_to_the_fair_share_too(db_url, tmp_path, clock):
    """Admin tokens are exempt from the operator caps, not from the share: a freed slot goes to the waiting user."""
    hub = await start_hub(db_url, tmp_path, clock)
    try:
        await hub.start_runner(slots=2)
        async with mcp_client(hub.url, hub.admin_token) as root, \
                mcp_client(hub.url, await hub.token("alice")) as alice:
            mine = await submit_over_mcp(root, 4)
            await eventually(lambda: _equals(on_runtime(hub, mine), 2))
            theirs = await submit_over_mcp(alice, 1)
            await end_one(hub, root, next(t for t, s in zip(mine, await statuses(hub, mine)) if s != "queued"))
            await eventually(lambda: _equals(on_runtime(hub, theirs), 1))
            assert (await statuses(hub, mine)).count("queued") == 2
    finally:
        await hub.stop()
