"""Task admission, placement, reservations and reconciliation — the same suite on SQLite and PostgreSQL."""
from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.app import Hub
from hub.errors import Invalid, NotFound, Unauthorized
from hub.runner import protocol as p
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import api_tokens, reservations, runtimes, task_events, task_runs
from tests.helpers import hub_settings, runner_accepted, runner_events, runner_finished, runner_outgoing

CAPS = {"platform": "linux", "engines": ["scripted"], "workspace_root": "/tmp", "workspace_writable": True}


@pytest.fixture
async def core(db, clock, tmp_path: Path):
    """The hub's services over one database, without HTTP."""
    hub = Hub(hub_settings(db.url, tmp_path), db, clock)
    admin_token = await hub.auth.create_token("admin", label="cli", admin=True)
    hub.admin = await hub.auth.authenticate(admin_token)
    return hub


async def register(hub: Hub, name: str = "r1", slots: int = 2, running=()) -> tuple[str, str]:
    rt, conn, _drop = await hub.registry.register(
        hub.admin, p.Register(name=name, slots=slots, capabilities=CAPS, running=list(running)))
    return rt, conn


async def submit(hub: Hub, prompt: str = "say hi", **kw) -> str:
    return (await hub.tasks.submit(hub.admin, SubmitRequest(prompt=prompt, profile="scripted", **kw)))["task_id"]


async def row(hub: Hub, task_id: str):
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(task_runs).where(task_runs.c.id == task_id))).first()


async def active_reservations(hub: Hub, runtime_id: str) -> int:
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(reservations).where(
            reservations.c.runtime_id == runtime_id, reservations.c.state.in_(["pending", "committed"])))).scalar()


async def test_token_is_stored_only_as_its_sha256_hash(core):
    token = await core.auth.create_token("alice")
    secret = token.split(".")[2]
    async with core.db.read() as conn:
        rows = (await conn.execute(sa.select(api_tokens))).all()
    assert all(token not in str(tuple(r)) and secret not in str(tuple(r)) for r in rows)
    assert hashlib.sha256(secret.encode()).hexdigest() in {r.token_hash for r in rows}


async def test_wrong_or_missing_token_is_refused_with_the_fix(core):
    token = await core.auth.create_token("alice")
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for bad in (None, "", "Bearer nope", f"Bearer {tampered}", "Bearer amux..x", "x" * 10000):
        with pytest.raises(Unauthorized) as e:
            await core.auth.authenticate(bad)
        assert "amux token create" in e.value.message


async def test_admission_freezes_the_execution_snapshot(core):
    await register(core)
    tid = await submit(core, model="my-unlisted-model", extra_args=["--subprocess", "--x"], timeout_s=30)
    r = await row(core, tid)
    assert r.status == "queued"
    assert r.snapshot["engine"] == "scripted" and r.snapshot["model"] == "my-unlisted-model"
    assert r.snapshot["extra_args"] == ["--subprocess", "--x"] and r.snapshot["subprocess"] is True
    assert r.snapshot["profile"]["digest"].startswith("sha256:")


@pytest.mark.parametrize("kw, fix", [
    ({"profile": "nope"}, "profile_list"),
    ({"runtime": "ghost"}, "registered runtimes"),
    ({"timeout_s": -1}, "timeout_s"),
    ({"extra_args": ["x"] * 1000}, "extra_args"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "x" * (300 * 1024)}, "limit"),
    ({"prompt": "dance"}, "unknown command"),
])
async def test_bad_submission_names_the_fix_and_stores_nothing(core, kw, fix):
    await register(core)
    kw = dict(kw)
    prompt = kw.pop("prompt", "say hi")
    with pytest.raises(Invalid) as e:
        await core.tasks.submit(core.admin, SubmitRequest(prompt=prompt, **{"profile": "scripted", **kw}))
    assert fix in e.value.message
    async with core.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(task_runs))).scalar() == 0


async def test_submission_without_any_runtime_for_the_engine_is_refused(core):
    with pytest.raises(Invalid, match="amux runner"):
        await submit(core)


async def test_placement_reserves_capacity_and_never_exceeds_runtime_slots(core):
    rt, _ = await register(core, slots=2)
    ids = [await submit(core) for _ in range(5)]
    assert await core.dispatcher.place_once() == 2
    assert await core.dispatcher.place_once() == 0
    assert await active_reservations(core, rt) == 2
    statuses = [(await row(core, t)).status for t in ids]
    assert statuses.count("dispatched") == 2 and statuses.count("queued") == 3


async def test_runner_commit_then_terminal_report_releases_the_reservation(core):
    rt, conn_id = await register(core, slots=1)
    tid = await submit(core)
    await core.dispatcher.place_once()
    out = await runner_outgoing(core.runner_dispatch, rt, conn_id, set())
    assert [m["type"] for m in out] == ["dispatch"] and out[0]["task_id"] == tid
    assert await runner_accepted(core.reports, rt, p.Accepted(task_id=tid, attempt=1)) == "ok"
    assert (await row(core, tid)).status == "running"
    ev = p.Events(task_id=tid, attempt=1, events=[p.Event(rseq=1, type="text", payload={"text": "hi"})])
    assert await runner_events(core.reports, rt, ev) == 1
    fin = p.Finished(task_id=tid, attempt=1, rseq=2, outcome="succeeded", result_text="hi", usage={"input_tokens": 3})
    assert await runner_finished(core.reports, rt, fin)
    r = await row(core, tid)
    assert (r.status, r.outcome, r.result_text, r.usage_json) == ("succeeded", "succeeded", "hi", {"input_tokens": 3})
    assert await active_reservations(core, rt) == 0


async def test_events_resent_by_a_reconnecting_runner_are_stored_once_with_a_monotonic_sequence(core):
    rt, _ = await register(core, slots=1)
    tid = await submit(core)
    await core.dispatcher.place_once()
    await runner_accepted(core.reports, rt, p.Accepted(task_id=tid, attempt=1))
    batch1 = [p.Event(rseq=i, type="text", payload={"text": f"t{i}"}) for i in (1, 2)]
    batch2 = [p.Event(rseq=i, type="text", payload={"text": f"t{i}"}) for i in (1, 2, 3)]
    await runner_events(core.reports, rt, p.Events(task_id=tid, attempt=1, events=batch1))
    await runner_events(core.reports, rt, p.Events(task_id=tid, attempt=1, events=batch2))
    async with core.db.read() as conn:
        seqs = [(r.seq, r.payload["text"]) for r in await conn.execute(
            sa.select(task_events).where(task_events.c.task_id == tid).order_by(task_events.c.seq))]
    assert seqs == [(1, "t1"), (2, "t2"), (3, "t3")]


async def test_equal_usage_snapshots_are_deduplicated_and_unknown_metrics_dropped(core):
    rt, _ = await register(core, slots=1)
    tid = await submit(core)
    await core.dispatcher.place_once()
    await runner_accepted(core.reports, rt, p.Accepted(task_id=tid, attempt=1))
    usage = {"input_tokens": 5, "bogus": 7, "output_tokens": -1}
    evs = [p.Event(rseq=i, type="usage", payload={"usage": usage}) for i in (1, 2)]
    await runner_events(core.reports, rt, p.Events(task_id=tid, attempt=1, events=evs))
    page = await core.tasks.events(core.admin, tid)
    assert [e["usage"] for e in page["events"]] == [{"input_tokens": 5}]


async def test_runner_reporting_a_task_it_does_not_hold_is_refused_and_the_task_only_records_the_drop(core):
    rt1, _ = await register(core, name="r1", slots=1)
    rt2, _ = await register(core, name="r2", slots=1)
    tid = await submit(core, runtime="r1")
    await core.dispatcher.place_once()
    assert await runner_accepted(core.reports, rt2, p.Accepted(task_id=tid, attempt=1)) == "drop"
    ev = p.Events(task_id=tid, attempt=1, events=[p.Event(rseq=1, type="text", payload={"text": "x"})])
    assert await runner_events(core.reports, rt2, ev) is None
    assert not await runner_finished(core.reports, rt2,
                                     p.Finished(task_id=tid, attempt=1, rseq=2, outcome="succeeded"))
    r = await row(core, tid)
    assert (r.status, r.runtime_id) == ("dispatched", rt1)
    events = (await core.tasks.events(core.admin, tid))["events"]  # each refused batch of reports, named on the task
    assert len(events) == 2 and all(e["type"] == "warning" and f"(runtime {rt2}) was dropped" in e["text"]
                                    for e in events)


async def test_uncommitted_reservation_expires_by_ttl_and_the_task_is_placed_again(core, clock):
    rt, _ = await register(core, slots=1)
    tid = await submit(core)
    await core.dispatcher.place_once()
    clock.advance(core.settings.hub.reservation_ttl_s - 1)
    assert (await core.dispatcher.reap_once())["expired"] == 0
    clock.advance(2)
    assert (await core.dispatcher.reap_once())["expired"] == 1
    assert (await row(core, tid)).status == "queued" and await active_reservations(core, rt) == 0
    assert await core.dispatcher.place_once() == 1
    assert (await row(core, tid)).attempt == 2


async def test_runtime_lost_past_the_timeout_fails_its_tasks_and_frees_capacity(core, clock):
    rt, conn_id = await register(core, slots=1)
    tid = await submit(core)
    await core.dispatcher.place_once()
    await runner_accepted(core.reports, rt, p.Accepted(task_id=tid, attempt=1))
    await core.registry.disconnected(rt, conn_id)
    clock.advance(core.settings.hub.runtime_lost_s - 1)
    assert (await core.dispatcher.reap_once())["lost"] == 0
    clock.advance(2)
    assert (await core.dispatcher.reap_once())["lost"] == 1
    r = await row(core, tid)
    assert r.status == "failed" and "runtime lost" in r.error
    assert await active_reservations(core, rt) == 0


async def test_heartbeats_keep_a_runtime_from_being_lost(core, clock):
    rt, conn_id = await register(core, slots=1)
    for _ in range(5):
        clock.advance(core.settings.hub.runtime_lost_s / 2)
        await core.reports.heartbeat(rt, conn_id)
        await core.dispatcher.reap_once()
    async with core.db.read() as conn:
        assert (await conn.execute(sa.select(runtimes.c.status).where(runtimes.c.id == rt))).scalar() == "online"


async def test_reconnecting_runner_keeps_reported_work_and_fails_work_it_no_longer_holds(core):
    rt, _ = await register(core, slots=2)
    kept, gone = await submit(core), await submit(core)
    await core.dispatcher.place_once()
    for t in (kept, gone):
        await runner_accepted(core.reports, rt, p.Accepted(task_id=t, attempt=1))
    _, _, drop = await core.registry.register(core.admin, p.Register(
        name="r1", slots=2, capabilities=CAPS,
        running=[p.RunningWork(task_id=kept, attempt=1), p.RunningWork(task_id="tr_unknown", attempt=1)]))
    assert drop == ["tr_unknown"]
    assert (await row(core, kept)).status == "running"
    assert (await row(core, gone)).status == "failed"


async def test_cancel_of_a_queued_task_ends_it_cancelled_at_once(core):
    await register(core)
    tid = await submit(core)
    ans = await core.tasks.cancel(core.admin, tid)
    assert ans["status"] == "cancelled" and (await row(core, tid)).outcome == "cancelled"


async def test_cancel_of_a_running_task_goes_through_its_runner(core):
    rt, conn_id = await register(core, slots=1)
    tid = await submit(core)
    await core.dispatcher.place_once()
    await runner_outgoing(core.runner_dispatch, rt, conn_id, set())
    await runner_accepted(core.reports, rt, p.Accepted(task_id=tid, attempt=1))
    answer = await core.tasks.cancel(core.admin, tid)
    assert answer["status"] == "running" and answer["attempt"] == 1  # the answer names the attempt it acted on
    sent: set[tuple[str, int]] = set()
    assert [(m["type"], m["attempt"]) for m in await runner_outgoing(core.runner_dispatch, rt, conn_id, sent)] \
        == [("cancel", 1)]  # so does the message: a runner running another attempt leaves that one alone
    assert await runner_outgoing(core.runner_dispatch, rt, conn_id, sent) == []  # sent once per connection
    await runner_finished(core.reports, rt, p.Finished(task_id=tid, attempt=1, rseq=1, outcome="cancelled"))
    assert (await row(core, tid)).outcome == "cancelled"


async def test_deadline_backstop_times_out_a_run_whose_runner_never_reports(core, clock):
    rt, conn_id = await register(core, slots=1)
    tid = await submit(core, timeout_s=10)
    await core.dispatcher.place_once()
    await runner_accepted(core.reports, rt, p.Accepted(task_id=tid, attempt=1))
    clock.advance(10 + core.settings.hub.deadline_grace_s - 1)
    await core.reports.heartbeat(rt, conn_id)
    assert (await core.dispatcher.reap_once())["timed_out"] == 0
    clock.advance(2)
    assert (await core.dispatcher.reap_once())["timed_out"] == 1
    assert (await row(core, tid)).outcome == "timed_out"


async def test_tasks_of_other_principals_are_invisible(core):
    await register(core)
    tid = await submit(core)
    bob = await core.auth.authenticate(await core.auth.create_token("bob"))
    with pytest.raises(NotFound, match="not yours"):
        await core.tasks.get(bob, tid)
    with pytest.raises(NotFound):
        await core.tasks.cancel(bob, tid)
    assert (await row(core, tid)).status == "queued"


async def test_a_private_runtime_only_runs_its_owners_tasks(core):
    bob = await core.auth.authenticate(await core.auth.create_token("bob"))
    await core.registry.register(bob, p.Register(name="bobs", slots=1, capabilities=CAPS))
    await core.tasks.submit(core.admin, SubmitRequest(prompt="say hi", profile="scripted"))
    assert await core.dispatcher.place_once() == 0
    await core.tasks.submit(bob, SubmitRequest(prompt="say hi", profile="scripted"))
    assert await core.dispatcher.place_once() == 1


async def test_concurrent_placement_from_two_hubs_on_postgres_never_overbooks(pg_url, clock, tmp_path):
    from hub.store.db import Database

    hubs = [Hub(hub_settings(pg_url, tmp_path), Database(pg_url), clock) for _ in range(2)]
    try:
        token = await hubs[0].auth.create_token("admin", admin=True)
        for h in hubs:
            h.admin = await h.auth.authenticate(token)
        rt, _ = await register(hubs[0], slots=3)
        for _ in range(40):
            await submit(hubs[0])
        placed = await asyncio.gather(*(h.dispatcher.place_once(batch=5) for h in hubs for _ in range(6)))
        assert sum(placed) == 3
        assert await active_reservations(hubs[0], rt) == 3
    finally:
        for h in hubs:
            await h.db.close()


async def test_a_lost_runtimes_never_accepted_run_is_placed_again_not_failed(core, clock):
    core.settings.hub.reservation_ttl_s = 3600  # the runtime is lost first, before the reservation would expire
    rt, conn_id = await register(core, slots=1)
    tid = await submit(core)
    await core.dispatcher.place_once()
    assert (await row(core, tid)).status == "dispatched"  # its engine never launched: the runner waits for the ack
    await core.registry.disconnected(rt, conn_id)
    clock.advance(core.settings.hub.runtime_lost_s + 1)
    counts = await core.dispatcher.reap_once()
    assert counts["requeued"] == 1 and counts["lost"] == 0
    r = await row(core, tid)
    assert r.status == "queued" and r.error is None and r.runtime_id is None
    assert await active_reservations(core, rt) == 0


async def test_a_lost_runtimes_running_task_ends_outcome_unknown_and_its_runners_late_report_corrects_it(core, clock):
    rt, conn_id = await register(core, slots=1)
    tid = await submit(core)
    await core.dispatcher.place_once()
    await runner_accepted(core.reports, rt, p.Accepted(task_id=tid, attempt=1))
    await core.registry.disconnected(rt, conn_id)
    clock.advance(core.settings.hub.runtime_lost_s + 1)
    await core.dispatcher.reap_once()
    r = await row(core, tid)
    assert r.status == "failed" and "outcome is unknown" in r.error and "may have finished" in r.error
    # The runner comes back holding the finished attempt: the hub keeps it (no drop) and records what happened.
    _rt, _conn, drop = await core.registry.register(
        core.admin, p.Register(name="r1", slots=1, capabilities=CAPS, running=[p.RunningWork(task_id=tid, attempt=1)]))
    assert tid not in drop
    assert await runner_finished(core.reports, rt, p.Finished(task_id=tid, attempt=1, rseq=3, outcome="succeeded",
                                                       result_text="done after all"))
    r = await row(core, tid)
    assert r.status == "succeeded" and r.outcome == "succeeded" and r.result_text == "done after all"
    async with core.db.read() as conn:
        texts = [e.payload.get("text", "") for e in (await conn.execute(
            sa.select(task_events).where(task_events.c.task_id == tid))).all()]
    assert any("declared lost and reported succeeded" in t for t in texts), texts


async def test_a_report_from_an_attempt_that_no_longer_holds_its_task_is_dropped_and_recorded(core, clock):
    rt, conn_id = await register(core, slots=1)
    tid = await submit(core)
    await core.dispatcher.place_once()
    clock.advance(core.settings.hub.reservation_ttl_s + 1)
    await core.dispatcher.reap_once()  # attempt 1's reservation expired: the task is queued again
    await core.dispatcher.place_once()  # attempt 2
    replies = await core.reports.apply(rt, conn_id, [p.Finished(task_id=tid, attempt=1, rseq=2, outcome="succeeded")])
    assert any(m.get("type") == "ack" and m.get("drop") for m in replies)
    r = await row(core, tid)
    assert r.attempt == 2 and r.status == "dispatched"
    async with core.db.read() as conn:
        texts = [e.payload.get("text", "") for e in (await conn.execute(
            sa.select(task_events).where(task_events.c.task_id == tid))).all()]
    assert any("attempt 1" in t and "was dropped" in t for t in texts), texts
