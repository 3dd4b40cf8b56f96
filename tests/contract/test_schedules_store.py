"""Schedules: definitions, the firing ledger, advancing, reconciliation — the same suite on SQLite and PostgreSQL."""
from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.app import Hub
from hub.config import PresetSettings
from hub.errors import Invalid, NotFound, TooMany
from hub.runner import protocol as p
from hub.services.schedules.firing import Due, ScheduleFiring
from hub.services.schedules.ports import RecordingOutcomeSink
from hub.services.schedules.service import ScheduleService, ScheduleSpec
from hub.services.tasks.service import SubmitRequest
from hub.store.db import Database
from hub.store.tables import firings, runtimes, schedules, task_runs
from hub.store.tasks import QueuedTask
from tests.fakes.sessions import FakeSessions
from tests.helpers import hub_settings

CAPS = {"platform": "linux", "engines": ["scripted"], "workspace_root": "/tmp", "workspace_writable": True}


@pytest.fixture
async def core(db, clock, tmp_path: Path):
    """The hub's services over one database, a recording outcome sink, a registered runtime."""
    hub = Hub(hub_settings(db.url, tmp_path), db, clock)
    hub.admin = await hub.auth.authenticate(await hub.auth.create_token("admin", label="cli", admin=True))
    hub.alice = await hub.auth.authenticate(await hub.auth.create_token("alice", label="claude-code"))
    hub.sink = RecordingOutcomeSink()
    hub.schedule_firing.sink = hub.sink
    await hub.registry.register(hub.admin, p.Register(name="r1", slots=2, capabilities=CAPS, running=[]))
    return hub


def spec(**kw) -> ScheduleSpec:
    base = {"name": "nightly", "prompt": "say hi", "rule": "every 5m", "profile": "scripted"}
    return ScheduleSpec(**{**base, **kw})


async def ledger(hub: Hub, sid: str) -> list:
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(firings).where(firings.c.schedule_id == sid)
                                   .order_by(firings.c.nominal_time))).all()


async def task(hub: Hub, task_id: str):
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(task_runs).where(task_runs.c.id == task_id))).first()


async def fire_at(hub: Hub, when_s: float) -> int:
    hub.clock.advance(when_s)
    return await hub.schedule_firing.fire_due()


async def test_creator_and_provenance_are_frozen_from_the_authenticated_caller(core):
    s = await core.schedules.create(core.alice, spec(), source="mcp")
    async with core.db.read() as conn:
        row = (await conn.execute(sa.select(schedules).where(schedules.c.id == s["schedule_id"]))).first()
    assert row.creator_id == core.alice.principal_id and row.creator_binding_id is None and row.app_id is None
    assert row.provenance == {"source": "mcp", "token_id": core.alice.token_id, "label": "claude-code",
                              "principal": "alice",
                              "attribution": {"basis": "no_binding"}}   # no linked Feishu identity to freeze
    assert s["creator"] == "alice"


async def test_the_definition_keeps_the_callers_choices_as_given_and_omitted_ones_stay_open(core):
    s = await core.schedules.create(core.alice, spec(runtime="r1", model="m-1", extra_args=["--x"],
                                                     permission_policy="deny-all"))
    got = await core.schedules.get(core.alice, s["schedule_id"])
    assert (got["runtime"], got["model"], got["extra_args"], got["permission_policy"]) == ("r1", "m-1", ["--x"],
                                                                                           "deny-all")
    assert got["reasoning_effort"] is None and got["timeout_s"] is None and got["schedule_type"] == "subtask"
    assert got["timezone"] == "UTC" and got["next_fire_at"] == (core.clock.now() + timedelta(minutes=5)).isoformat()


@pytest.mark.parametrize("kw, fix", [
    ({"permission_policy": "escalate-to-main"}, "unavailable for scheduled subtasks"),
    ({"profile": "nope"}, "profile"),
    ({"rule": "sometimes"}, '"every 30s"'),
    ({"timezone": "Nowhere/Town"}, "IANA"),
    ({"rule": "at 2020-01-01T00:00:00Z"}, "no future fire time"),
    ({"schedule_type": "weekly"}, "subtask"),
    ({"prompt": "   "}, "prompt is empty"),
    ({"session_ref": "main"}, "session-prompt schedules only"),
    ({"overlap": "forbid"}, '"skip" (no new Task while the previous one is unfinished)'),
    ({"rule": "@reboot"}, "replicas"),
])
async def test_creation_validates_like_task_submission_and_names_the_fix(core, kw, fix):
    with pytest.raises(Invalid) as e:
        await core.schedules.create(core.alice, spec(**kw))
    assert fix in e.value.message


async def test_a_due_schedule_persists_one_firing_admits_a_task_and_records_ok_with_the_task_id(core):
    s = await core.schedules.create(core.alice, spec())
    assert await fire_at(core, 299) == 0
    assert await fire_at(core, 1) == 1
    [f] = await ledger(core, s["schedule_id"])
    assert f.admission == "ok" and f.task_id and f.outcome is None and f.reconciled_at is None
    t = await task(core, f.task_id)
    assert t.status == "queued" and t.owner_id == core.alice.principal_id and t.prompt == "say hi"
    assert t.snapshot["engine"] == "scripted"
    got = await core.schedules.get(core.alice, s["schedule_id"])
    assert got["next_fire_at"] == (core.clock.now() + timedelta(minutes=5)).isoformat()
    hist = await core.schedules.history(core.alice, s["schedule_id"])
    assert hist["firings"][0]["receipt"] == f"ok:task:{f.task_id}"


async def test_content_and_omitted_defaults_are_resolved_again_at_each_trigger(core):
    s = await core.schedules.create(core.alice, spec())
    await fire_at(core, 300)
    [first] = await ledger(core, s["schedule_id"])
    frozen = dict((await task(core, first.task_id)).snapshot)  # as admitted at the first trigger
    core.settings.hub.default_timeout_s = 77  # an omitted default changes between fires
    core.settings.profiles.presets = {"scripted": PresetSettings(model="m-later", reasoning_effort="low")}
    await core.schedules.update(core.alice, s["schedule_id"], ScheduleSpec(prompt="say again"))
    await fire_at(core, 300)
    first, second = await ledger(core, s["schedule_id"])
    t1, t2 = await task(core, first.task_id), await task(core, second.task_id)
    assert t1.snapshot["timeout_s"] == 3600 and t2.snapshot["timeout_s"] == 77
    assert t1.prompt == "say hi" and t2.prompt == "say again"
    # What the changed preset resolves to now differs from what the first Task froze, and that Task kept its own.
    assert (t2.snapshot["model"], t2.snapshot["reasoning_effort"]) == ("m-later", "low")
    assert (frozen["model"], frozen["reasoning_effort"]) == (None, None) and t2.snapshot != frozen
    assert t1.snapshot == frozen  # an admitted Task's snapshot stays frozen


async def test_a_tasks_snapshot_keeps_the_profile_it_was_admitted_with_after_the_profile_changes(core):
    manifest = {"manifest_version": 2, "name": "nightly-bot", "engine": "scripted", "description": "v1",
                "expert": {"instructions": "Follow plan v1."}}
    await core.profiles.add(core.admin, json.dumps(manifest))
    s = await core.schedules.create(core.alice, spec(profile="nightly-bot"))
    await fire_at(core, 300)
    [first] = await ledger(core, s["schedule_id"])
    frozen = dict((await task(core, first.task_id)).snapshot)
    await core.profiles.add(core.admin, json.dumps({**manifest, "expert": {"instructions": "Follow plan v2."}}))
    await fire_at(core, 300)
    first, second = await ledger(core, s["schedule_id"])
    t1, t2 = await task(core, first.task_id), await task(core, second.task_id)
    assert t2.snapshot["profile"]["instructions"] == "Follow plan v2."  # what the changed profile resolves to now
    assert t2.snapshot["profile"]["digest"] != frozen["profile"]["digest"]
    assert t1.snapshot == frozen and frozen["profile"]["instructions"] == "Follow plan v1."


async def test_no_eligible_runtime_online_is_skipped_offline_and_the_rule_still_advances(core):
    s = await core.schedules.create(core.alice, spec())
    async with core.db.write() as conn:
        await conn.execute(runtimes.update().values(status="offline"))
    await fire_at(core, 300)
    [f] = await ledger(core, s["schedule_id"])
    assert f.admission == "skipped:offline" and f.task_id is None and f.outcome is None
    got = await core.schedules.get(core.alice, s["schedule_id"])
    assert got["next_fire_at"] == (core.clock.now() + timedelta(minutes=5)).isoformat()
    assert [e.admission for e in core.sink.events] == ["skipped:offline"]


async def test_a_refused_dispatch_is_recorded_as_error_with_its_reason_and_the_rule_advances(core):
    s = await core.schedules.create(core.alice, spec(runtime="r1"))
    async with core.db.write() as conn:
        await conn.execute(runtimes.update().values(name="renamed"))
    await fire_at(core, 300)
    await fire_at(core, 300)
    rows = await ledger(core, s["schedule_id"])
    assert len(rows) == 2 and all(r.admission.startswith("error:unknown runtime 'r1'") for r in rows)
    assert all(r.task_id is None for r in rows)


async def test_a_one_shot_rule_fires_once_and_is_consumed(core):
    at = (core.clock.now() + timedelta(seconds=30)).isoformat()
    s = await core.schedules.create(core.alice, spec(rule=f"at {at}"))
    await fire_at(core, 30)
    await fire_at(core, 3600)
    assert len(await ledger(core, s["schedule_id"])) == 1
    got = await core.schedules.get(core.alice, s["schedule_id"])
    assert got["next_fire_at"] is None and got["consumed"] and got["one_shot"]


async def test_a_consumed_one_shot_whose_dispatch_failed_is_not_retried(core):
    at = (core.clock.now() + timedelta(seconds=30)).isoformat()
    s = await core.schedules.create(core.alice, spec(rule=f"at {at}"))
    async with core.db.write() as conn:
        await conn.execute(runtimes.update().values(status="offline"))
    await fire_at(core, 30)
    async with core.db.write() as conn:
        await conn.execute(runtimes.update().values(status="online"))
    await fire_at(core, 60)
    [f] = await ledger(core, s["schedule_id"])
    assert f.admission == "skipped:offline"


async def test_a_fire_later_than_the_grace_is_recorded_missed_and_consecutive_misses_collapse(core):
    s = await core.schedules.create(core.alice, spec())
    await fire_at(core, 300 + 61)          # 09:05 fired at 09:06:01: missed
    await fire_at(core, 300)               # 09:10 fired at 09:11:01: missed again — same row
    [f] = await ledger(core, s["schedule_id"])
    assert (f.admission, f.outcome, f.missed_count, f.task_id) == ("missed", "missed", 2, None)
    assert [e.outcome for e in core.sink.events] == ["missed", "missed"] and core.sink.events[-1].missed_count == 2
    await fire_at(core, 239)               # 09:15 on time
    rows = await ledger(core, s["schedule_id"])
    assert [r.admission for r in rows] == ["missed", "ok"]


async def test_the_reconciler_copies_the_tasks_canonical_terminal_outcome_and_publishes_it(core):
    s = await core.schedules.create(core.alice,
                                    spec(rule="at " + (core.clock.now() + timedelta(seconds=5)).isoformat()))
    await fire_at(core, 5)
    [f] = await ledger(core, s["schedule_id"])
    assert await core.schedule_firing.reconcile() == 0  # still queued
    await core.tasks.cancel(core.alice, f.task_id)
    assert await core.schedule_firing.reconcile() == 1
    [f] = await ledger(core, s["schedule_id"])
    assert f.outcome == "cancelled" and f.reconciled_at is not None
    [e] = core.sink.events
    assert (e.outcome, e.creator_id, e.one_shot, e.schedule_type, e.task_id) == (
        "cancelled", core.alice.principal_id, True, "subtask", f.task_id)
    assert await core.schedule_firing.reconcile() == 0  # published once


async def test_a_firing_whose_dispatch_was_never_recorded_becomes_unknown_and_is_never_replayed(core):
    s = await core.schedules.create(core.alice, spec())
    sched = (await core.schedules.get(core.alice, s["schedule_id"]))
    now = core.clock.now()
    async with core.db.write() as conn:  # what a hub that died right after the claim commit leaves behind
        await conn.execute(firings.insert().values(id="fir_crash", schedule_id=sched["schedule_id"], nominal_time=now,
                                                   fired_at=now, missed_count=0, legacy=False))
    assert await core.schedule_firing.reconcile() == 0
    core.clock.advance(core.settings.schedules.unknown_after_s + 1)
    assert await core.schedule_firing.reconcile() == 1
    [f] = await ledger(core, s["schedule_id"])
    assert (f.admission, f.outcome, f.task_id) == (None, "unknown", None)
    assert core.sink.events[0].outcome == "unknown"
    # a dispatch result arriving after that is discarded: no Task is admitted for it
    async with core.db.read() as conn:
        row = (await conn.execute(sa.select(schedules).where(schedules.c.id == s["schedule_id"]))).first()
    late = QueuedTask(task_id="tr_late", owner_id=core.alice.principal_id, name=None, prompt="say hi",
                      snapshot={"engine": "scripted"}, now=now)
    d = Due(firing_id="fir_crash", schedule=row, nominal=now, result=("ok", "tr_late", None), task=late)
    await core.schedule_firing._record([d], core.clock.now())
    assert await task(core, "tr_late") is None
    assert (await ledger(core, s["schedule_id"]))[0].outcome == "unknown"


async def test_pause_stops_future_dispatch_and_never_cancels_an_admitted_task(core):
    s = await core.schedules.create(core.alice, spec())
    await fire_at(core, 300)
    await core.schedules.pause(core.alice, s["schedule_id"])
    await fire_at(core, 3000)
    [f] = await ledger(core, s["schedule_id"])
    assert (await task(core, f.task_id)).status == "queued"
    resumed = await core.schedules.resume(core.alice, s["schedule_id"])
    assert datetime.fromisoformat(resumed["next_fire_at"]) > core.clock.now()  # no missed runs for the pause
    await core.schedules.delete(core.alice, s["schedule_id"])
    await fire_at(core, 3000)
    assert len(await ledger(core, s["schedule_id"])) == 1
    assert (await task(core, f.task_id)).status == "queued"
    with pytest.raises(NotFound):
        await core.schedules.get(core.alice, s["schedule_id"])


async def test_update_replaces_given_fields_clears_with_empty_string_and_restarts_the_rule(core):
    s = await core.schedules.create(core.alice, spec(model="m-1"))
    core.clock.advance(60)
    got = await core.schedules.update(core.alice, s["schedule_id"], ScheduleSpec(rule="0 * * * *", model=""))
    assert got["model"] is None and got["rule"] == "0 * * * *" and got["next_fire_at"] == "2026-01-05T10:00:00+00:00"
    with pytest.raises(Invalid, match="unavailable for scheduled subtasks"):
        await core.schedules.update(core.alice, s["schedule_id"], ScheduleSpec(permission_policy="escalate-to-main"))


async def test_another_principal_cannot_see_or_change_a_schedule(core):
    s = await core.schedules.create(core.alice, spec())
    bob = await core.auth.authenticate(await core.auth.create_token("bob"))
    for call in (core.schedules.get(bob, s["schedule_id"]), core.schedules.pause(bob, s["schedule_id"]),
                 core.schedules.history(bob, s["schedule_id"]), core.schedules.delete(bob, s["schedule_id"])):
        with pytest.raises(NotFound):
            await call
    assert await core.schedules.list(bob) == []
    assert len(await core.schedules.list(core.admin, all_principals=True)) == 1


async def test_history_is_paginated_newest_first(core):
    s = await core.schedules.create(core.alice, spec(rule="every 1m"))
    for _ in range(5):
        await fire_at(core, 60)
    page = await core.schedules.history(core.alice, s["schedule_id"], limit=2)
    assert len(page["firings"]) == 2 and page["next_cursor"] == 2
    rest = await core.schedules.history(core.alice, s["schedule_id"], cursor=4, limit=2)
    assert len(rest["firings"]) == 1 and rest["next_cursor"] is None
    assert page["firings"][0]["nominal_time"] > page["firings"][1]["nominal_time"] > rest["firings"][0]["nominal_time"]


async def test_two_firing_loops_claiming_at_once_fire_each_nominal_time_exactly_once(core, db_url, clock):
    for i in range(40):
        await core.schedules.create(core.alice, spec(name=f"s{i}", rule="every 1m"))
    other_db = Database(db_url)
    other = ScheduleFiring(other_db, clock, core.settings.schedules, core.admission, core.tasks.queue)
    try:
        for _ in range(3):
            clock.advance(60)
            await asyncio.gather(core.schedule_firing.fire_due(), other.fire_due())
    finally:
        await other_db.close()
    async with core.db.read() as conn:
        rows = (await conn.execute(sa.select(firings.c.schedule_id, firings.c.nominal_time, firings.c.admission))).all()
    assert len(rows) == 120 and len({(r.schedule_id, r.nominal_time) for r in rows}) == 120
    assert {r.admission for r in rows} == {"ok"}


async def test_one_replicas_firing_loops_claiming_at_once_fire_each_nominal_time_exactly_once(core):
    """`schedules.firing_workers` loops share one ScheduleFiring: they claim apart as replicas do."""
    core.settings.schedules.claim_batch = 7  # several batches per minute, so the loops really interleave
    for i in range(40):
        await core.schedules.create(core.alice, spec(name=f"s{i}", rule="every 1m"))
    for _ in range(3):
        core.clock.advance(60)
        while sum(await asyncio.gather(*(core.schedule_firing.fire_due() for _ in range(3)))):
            pass
    async with core.db.read() as conn:
        rows = (await conn.execute(sa.select(firings.c.schedule_id, firings.c.nominal_time, firings.c.admission,
                                             firings.c.task_id))).all()
        tasks = (await conn.execute(sa.select(sa.func.count()).select_from(task_runs))).scalar()
    assert len(rows) == 120 and len({(r.schedule_id, r.nominal_time) for r in rows}) == 120
    assert {r.admission for r in rows} == {"ok"} and len({r.task_id for r in rows}) == 120 == tasks


async def queued_of(hub: Hub, owner_id: str) -> int:
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(task_runs).where(
            task_runs.c.owner_id == owner_id, task_runs.c.status == "queued"))).scalar()


async def test_the_queue_limit_holds_for_schedule_made_tasks_and_a_refused_firing_records_the_limit_and_advances(
        core):
    """Four per-second schedules of one user under `max_queued_per_principal = 2`
    queue 2 Tasks, not one per fire; the other firings record the refusal `task_submit` gives, and every rule
    advances."""
    core.settings.hub.max_queued_per_principal = 2
    mine = [(await core.schedules.create(core.alice, spec(name=f"s{i}", rule="every 1s")))["schedule_id"]
            for i in range(4)]
    bob = await core.auth.authenticate(await core.auth.create_token("bob"))
    theirs = (await core.schedules.create(bob, spec(name="b", rule="every 1s")))["schedule_id"]
    for _ in range(3):
        assert await fire_at(core, 1) == 5
    assert await queued_of(core, core.alice.principal_id) == 2  # the limit, not 12
    with pytest.raises(TooMany) as refusal:  # what task_submit (and REST's 429 `fix`) says to alice now
        await core.tasks.submit(core.alice, SubmitRequest(prompt="say hi", profile="scripted"))
    rows = [f for sid in mine for f in await ledger(core, sid)]
    ok = [f for f in rows if f.admission == "ok"]
    refused = [f for f in rows if f.admission != "ok"]
    assert len(rows) == 12 and len(ok) == 2 and len(refused) == 10
    assert {f.admission for f in refused} == {"error:limit_reached: " + refusal.value.message}
    assert "hub.max_queued_per_principal = 2" in refused[0].admission
    # nothing half-made: a refused firing has no Task, is reconciled at once and published with no outcome
    assert all(f.task_id is None and f.reconciled_at is not None and f.outcome is None for f in refused)
    assert sum(e.admission.startswith("error:limit_reached") for e in core.sink.events if e.schedule_id in mine) == 10
    async with core.db.read() as conn:
        tasks = (await conn.execute(sa.select(sa.func.count()).select_from(task_runs).where(
            task_runs.c.owner_id == core.alice.principal_id))).scalar()
    assert tasks == 2
    for sid in mine:  # every attempted fire advances the rule, refused ones included
        got = await core.schedules.get(core.alice, sid)
        assert got["next_fire_at"] == (core.clock.now() + timedelta(seconds=1)).isoformat()
    assert [f.admission for f in await ledger(core, theirs)][:2] == ["ok"] * 2  # bob's limit is his own
    # a queued Task that ends frees a place: the next fire admits one again
    await core.tasks.cancel(core.alice, ok[0].task_id)
    await fire_at(core, 1)
    assert await queued_of(core, core.alice.principal_id) == 2


async def test_a_creator_holding_an_admin_token_is_exempt_from_the_queue_limit_as_at_task_submit(core):
    core.settings.hub.max_queued_per_principal = 1
    for i in range(3):
        await core.schedules.create(core.admin, spec(name=f"s{i}", rule="every 1s"))
    await fire_at(core, 1)
    assert await queued_of(core, core.admin.principal_id) == 3


async def test_two_firing_loops_claiming_at_once_keep_the_queue_limit_for_schedule_made_tasks(core, db_url, clock):
    """Two replicas' firing batches admit one after another (the creator's row is locked), so together they queue
    no more than the limit."""
    core.settings.hub.max_queued_per_principal = 5
    for i in range(40):
        await core.schedules.create(core.alice, spec(name=f"s{i}", rule="every 1m"))
    other_db = Database(db_url)
    other = ScheduleFiring(other_db, clock, core.settings.schedules, core.admission, core.tasks.queue)
    core.settings.schedules.claim_batch = 7  # several batches each, so the two really interleave
    try:
        for _ in range(2):
            clock.advance(60)
            while sum(await asyncio.gather(core.schedule_firing.fire_due(), other.fire_due())):
                pass
    finally:
        await other_db.close()
    async with core.db.read() as conn:
        rows = (await conn.execute(sa.select(firings.c.admission, firings.c.task_id))).all()
    assert len(rows) == 80 and await queued_of(core, core.alice.principal_id) == 5
    assert sum(r.admission == "ok" for r in rows) == 5 == len({r.task_id for r in rows if r.task_id})
    assert all(r.admission.startswith("error:limit_reached: ") for r in rows if r.admission != "ok")


async def test_a_firing_step_or_a_reconciler_round_with_nothing_due_opens_no_write_transaction(core):
    s = await core.schedules.create(core.alice, spec(name="s", rule="every 1m"))
    writes, inner = [0], core.db.write

    @contextlib.asynccontextmanager
    async def counted():
        writes[0] += 1
        async with inner() as conn:
            yield conn

    core.db.write = counted
    assert 0 < await core.schedule_firing.firing_step() <= core.settings.schedules.poll_s  # nothing due yet
    assert await core.schedule_firing.reconcile() == 0  # no firing at all
    assert writes[0] == 0
    core.clock.advance(60)
    await core.schedule_firing.firing_step()  # due now: claimed, persisted and dispatched in write transactions
    assert writes[0] > 0 and len(await ledger(core, s["schedule_id"])) == 1


async def test_one_batch_admits_each_firing_on_its_own_choices_and_a_refusal_stays_with_its_schedule(core):
    """A batch resolves a set of choices once, yet each firing gets its own Task with its own prompt and
    snapshot, and one schedule's refusal is recorded on that schedule only."""
    ok = [await core.schedules.create(core.alice, spec(name=f"ok{i}", prompt=f"say {i}")) for i in range(3)]
    bad = await core.schedules.create(core.alice, spec(name="bad", runtime="r1"))
    other = await core.schedules.create(core.admin, spec(name="admin's", timeout_s=42))
    async with core.db.write() as conn:  # renamed after creation: only the schedule naming r1 is refused
        await conn.execute(runtimes.update().values(name="r2"))
    assert await fire_at(core, 300) == 5
    got = {}
    for s in [*ok, bad, other]:
        [f] = await ledger(core, s["schedule_id"])
        got[s["schedule_id"]] = f
    assert got[bad["schedule_id"]].admission.startswith("error:unknown runtime 'r1'")
    prompts = {(await task(core, got[s["schedule_id"]].task_id)).prompt for s in ok}
    assert prompts == {"say 0", "say 1", "say 2"}
    t_other = await task(core, got[other["schedule_id"]].task_id)
    assert t_other.owner_id == core.admin.principal_id and t_other.snapshot["timeout_s"] == 42
    t0 = await task(core, got[ok[0]["schedule_id"]].task_id)
    assert t0.owner_id == core.alice.principal_id and t0.snapshot["timeout_s"] == 3600


async def test_session_prompt_is_refused_without_sessions_naming_the_subtask_path(core):
    svc = ScheduleService(core.db, core.clock, core.settings.schedules, core.admission, None)
    with pytest.raises(Invalid, match="use schedule_type \"subtask\""):
        await svc.create(core.alice,
                         ScheduleSpec(name="n", prompt="hi", rule="every 5m", schedule_type="session-prompt",
                                                  session_ref="main"))


@pytest.fixture
def with_fake_sessions(core):
    fake = FakeSessions()
    core.schedules.sessions = fake
    core.schedule_firing.sessions = fake
    return fake


async def test_session_prompt_submits_into_the_resolved_session_and_reconciles_the_exact_turn(core, with_fake_sessions):
    fake = with_fake_sessions
    s = await core.schedules.create(core.alice, ScheduleSpec(name="n", prompt="status?", rule="every 5m",
                                                             schedule_type="session-prompt", session_ref="main"))
    assert s["session_ref"] == "ses_1"
    await fire_at(core, 300)
    [turn] = fake.turns
    assert turn == {"turn_id": "turn_1", "session_id": "ses_1", "prompt": "status?", "source": "schedule",
                    "principal": "alice"}
    [f] = await ledger(core, s["schedule_id"])
    assert (f.admission, f.turn_id, f.task_id) == ("ok", "turn_1", None)
    assert await core.schedule_firing.reconcile() == 0
    fake.outcomes["turn_1"] = "failed"
    assert await core.schedule_firing.reconcile() == 1
    [f] = await ledger(core, s["schedule_id"])
    assert f.outcome == "failed"
    assert (core.sink.events[0].turn_id, core.sink.events[0].schedule_type) == ("turn_1", "session-prompt")
    hist = await core.schedules.history(core.alice, s["schedule_id"])
    assert hist["firings"][0]["receipt"] == "ok:turn:turn_1"


@pytest.mark.parametrize("ref, fix", [("dup", "use the id"), ("ghost", "create one"), (None, "session_ref")])
async def test_session_prompt_needs_a_session_ref_that_names_exactly_one_session(core, with_fake_sessions, ref, fix):
    with pytest.raises(Exception) as e:
        await core.schedules.create(core.alice, ScheduleSpec(name="n", prompt="x", rule="every 5m",
                                                             schedule_type="session-prompt", session_ref=ref))
    assert fix in str(e.value)


async def test_a_session_prompt_delivery_failure_is_an_error_admission_and_the_rule_advances(core, with_fake_sessions):
    s = await core.schedules.create(core.alice, ScheduleSpec(name="n", prompt="x", rule="every 5m",
                                                             schedule_type="session-prompt", session_ref="main"))
    with_fake_sessions.refuse = "the session is archived"
    await fire_at(core, 300)
    await fire_at(core, 300)
    rows = await ledger(core, s["schedule_id"])
    assert [r.admission for r in rows] == ["error:the session is archived"] * 2


# --- overlap: what a fire does while the schedule's previous Task is unfinished (here: still queued) ----

async def test_overlap_defaults_to_allow_and_a_second_fire_admits_beside_the_unfinished_task(core):
    s = await core.schedules.create(core.alice, spec())
    assert s["overlap"] == "allow"
    await fire_at(core, 300)
    await fire_at(core, 300)
    first, second = await ledger(core, s["schedule_id"])
    assert (first.admission, second.admission) == ("ok", "ok")
    assert [(await task(core, f.task_id)).status for f in (first, second)] == ["queued", "queued"]


async def test_overlap_skip_records_skipped_overlap_and_admits_no_task_while_the_previous_is_unfinished(core):
    s = await core.schedules.create(core.alice, spec(overlap="skip"))
    await fire_at(core, 300)
    await fire_at(core, 300)
    first, second = await ledger(core, s["schedule_id"])
    assert first.admission == "ok" and (await task(core, first.task_id)).status == "queued"
    assert (second.admission, second.task_id, second.outcome) == ("skipped:overlap", None, None)
    assert second.reconciled_at is not None  # admission, not an outcome: nothing to wait for
    [event] = [e for e in core.sink.events if e.firing_id == second.id]
    assert (event.outcome, event.admission) == (None, "skipped:overlap")
    async with core.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(task_runs))).scalar() == 1


async def test_overlap_replace_cancels_the_unfinished_task_then_admits_the_new_one(core):
    s = await core.schedules.create(core.alice, spec(overlap="replace"))
    await fire_at(core, 300)
    await fire_at(core, 300)
    first, second = await ledger(core, s["schedule_id"])
    old, new = await task(core, first.task_id), await task(core, second.task_id)
    assert (old.status, old.error) == ("cancelled", "cancelled before it started")  # the task_cancel path
    assert second.admission == "ok" and new.status == "queued"
    await core.schedule_firing.reconcile()
    first, _ = await ledger(core, s["schedule_id"])
    assert first.outcome == "cancelled"


async def test_overlap_replace_is_crash_safe_a_crash_before_the_commit_leaves_the_old_task_and_no_new_one(
        core, monkeypatch):
    s = await core.schedules.create(core.alice, spec(overlap="replace"))
    await fire_at(core, 300)
    [first] = await ledger(core, s["schedule_id"])
    admit = core.schedule_firing.admitter.admit

    async def crash(conn, tasks):  # the hub dies inside the transaction that replaces: after the cancel, before
        raise ConnectionError("the hub died")  # the commit (a lost connection rolls the transaction back)

    monkeypatch.setattr(core.schedule_firing.admitter, "admit", crash)
    with pytest.raises(ConnectionError):
        await fire_at(core, 300)
    monkeypatch.setattr(core.schedule_firing.admitter, "admit", admit)
    first, second = await ledger(core, s["schedule_id"])
    assert (await task(core, first.task_id)).status == "queued"  # the old Task goes on: its cancel never committed
    assert (second.admission, second.task_id) == (None, None)  # and no new one
    async with core.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(task_runs))).scalar() == 1
    core.clock.advance(core.settings.schedules.unknown_after_s + 1)
    await core.schedule_firing.reconcile()
    _, second = await ledger(core, s["schedule_id"])
    assert second.outcome == "unknown"  # the card explains the firing: its outcome was never observed
    assert (await task(core, first.task_id)).status == "queued"


async def test_overlap_is_changed_by_update_and_a_finished_previous_task_never_holds_a_fire_back(core):
    s = await core.schedules.create(core.alice, spec())
    assert (await core.schedules.update(core.alice, s["schedule_id"], ScheduleSpec(overlap="skip")))["overlap"] == \
        "skip"
    await fire_at(core, 300)
    [first] = await ledger(core, s["schedule_id"])
    await core.tasks.cancel(core.alice, first.task_id)  # finished (cancelled): not unfinished any more
    await fire_at(core, 300)
    _, second = await ledger(core, s["schedule_id"])
    assert second.admission == "ok" and second.task_id


async def test_a_session_prompt_schedule_takes_overlap_allow_only(core):
    core.schedules.sessions = FakeSessions()
    with pytest.raises(Invalid) as e:
        await core.schedules.create(core.alice, ScheduleSpec(prompt="hi", rule="every 5m", overlap="skip",
                                                             schedule_type="session-prompt", session_ref="main"))
    assert "queue in their Session" in e.value.message and 'schedule_type "subtask"' in e.value.message

