"""SqlIncidentStore and SqlOutboxStore on SQLite and PostgreSQL: one test per rule a method states."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from hub.clock import utc
from hub.store.db import Database
from hub.store.incidents import (LIVE, DecidedElsewhere, NewDecision, NoticeClaim, NoticeSent, SqlIncidentStore,
                                 SqlOutboxStore)
from hub.store.tables import (decisions, firings, identity_bindings, incidents, outbox, principals, recovery_results,
                              recovery_runs, schedules)

APP = "cli_store"


@pytest.fixture
def store(db: Database) -> SqlIncidentStore:
    return SqlIncidentStore(db)


@pytest.fixture
def box(db: Database) -> SqlOutboxStore:
    return SqlOutboxStore(db)


async def seed_schedule(db: Database, now: datetime, sid: str = "sch_1", creator: str | None = "prn_1",
                        name: str = "nightly") -> str:
    async with db.write() as conn:
        known = (await conn.execute(sa.select(principals.c.id).where(principals.c.id == creator))).first()
        if creator and known is None:
            await conn.execute(principals.insert().values(id=creator, kind="user", name=f"name-{creator}",
                                                          created_at=now))
        await conn.execute(schedules.insert().values(
            id=sid, creator_id=creator, type="prompt", name=name, prompt="p", rule="every 5m", timezone="UTC",
            paused=False, created_at=now, updated_at=now))
    return sid


def values(now: datetime, state: str = "open", schedule_id: str = "sch_1", **kw) -> dict:
    v = {"state": state, "opened_at": now, "failures": 1, "missed": 0, "unknowns": 0, "notify_at": None,
         "notified_at": None, "recovering_since": None, "closed_at": None, "acked_at": None, "snoozed_until": None,
         "last_ping_at": None, "last_outcome": "failed",
         "active_key": schedule_id if state in ("pending", "open", "recovering") else None, "updated_at": now}
    v.update(kw)
    return v


async def open_incident(db: Database, store: SqlIncidentStore, now: datetime, iid: str, schedule_id: str = "sch_1",
                        app_id: str = APP, state: str = "open", creator: str | None = "prn_1", **kw) -> str:
    async with db.write() as conn:
        await store.open(conn, incident_id=iid, schedule_id=schedule_id, app_id=app_id, creator_id=creator,
                         values=values(now, state, schedule_id, **kw))
    return iid


async def add_notice(db: Database, box: SqlOutboxStore, now: datetime, nid: str, *, kind: str = "receipt",
                     app_id: str = APP, recipient: str | None = "ou_admin", incident_id: str | None = None,
                     due: datetime | None = None, payload: dict | None = None) -> str:
    async with db.write() as conn:
        await box.add(conn, notice_id=nid, app_id=app_id, recipient=recipient, kind=kind, payload=payload or {"i": nid},
                      timezone="UTC", incident_id=incident_id, schedule_id="sch_1", due=due or now, now=now)
    return nid


async def notice(db: Database, nid: str):
    async with db.read() as conn:
        return (await conn.execute(sa.select(outbox).where(outbox.c.id == nid))).first()


async def add_app(db: Database, store: SqlIncidentStore, now: datetime, app_id: str = APP,
                  admin: str | None = "ou_admin", state: str = "ok") -> None:
    async with db.write() as conn:
        await store.add_app(conn, app_id=app_id, admin_open_id=admin, delivery_state=state, diagnostic=None,
                            timezone="UTC", now=now)


# ---------------------------------------------------------------- decisions


async def test_an_outcome_is_decided_once_a_second_decision_with_its_ingest_key_raises(db, store, clock):
    now = clock.now()
    async with db.write() as conn:
        assert not await store.is_decided(conn, "fir_1:0")
        await store.log(conn, decision_id="dec_1", at=now, decision="opened", detail="d", ingest_key="fir_1:0",
                        firing_id="fir_1")
    with pytest.raises(DecidedElsewhere):
        async with db.write() as conn:
            await store.log(conn, decision_id="dec_2", at=now, decision="opened", detail="d", ingest_key="fir_1:0")
    async with db.read() as conn:
        assert await store.is_decided(conn, "fir_1:0")
    async with db.write() as conn:  # rows without a key are a log: any number of them
        for i in range(3):
            await store.log(conn, decision_id=f"dec_free{i}", at=now, decision="sent", detail=None, firing_id="fir_1")


async def test_log_many_appends_every_decision_of_a_round_at_one_time(db, store, clock):
    now = clock.now()
    async with db.write() as conn:
        await store.log_many(conn, now, [])
        await store.log_many(conn, now, [
            NewDecision(decision_id="dec_a", decision="sent", detail="card delivered as om_1", notice_id="ntc_a",
                        incident_id="inc_1", schedule_id="sch_1"),
            NewDecision(decision_id="dec_b", decision="sent", detail=None, notice_id="ntc_b")])
    async with db.read() as conn:
        rows = (await conn.execute(sa.select(decisions).order_by(decisions.c.id))).all()
    assert [(r.id, r.decision, r.detail, r.notice_id, r.incident_id, r.schedule_id, r.ingest_key, utc(r.at))
            for r in rows] == [("dec_a", "sent", "card delivered as om_1", "ntc_a", "inc_1", "sch_1", None, now),
                               ("dec_b", "sent", None, "ntc_b", None, None, None, now)]


async def test_missed_counts_decided_reads_the_count_from_each_keyed_decision_of_the_firing(db, store, clock):
    now = clock.now()
    async with db.write() as conn:
        for key in ("fir_m:1", "fir_m:4"):
            await store.log(conn, decision_id=f"dec_{key}", at=now, decision="aggregated", detail=None,
                            ingest_key=key, firing_id="fir_m")
        await store.log(conn, decision_id="dec_nokey", at=now, decision="sent", detail=None, firing_id="fir_m")
        await store.log(conn, decision_id="dec_other", at=now, decision="opened", detail=None, ingest_key="fir_o:9",
                        firing_id="fir_o")
    async with db.read() as conn:
        assert sorted(await store.missed_counts_decided(conn, "fir_m")) == [1, 4]


async def test_decisions_of_an_incident_come_oldest_first(db, store, clock):
    now = clock.now()
    async with db.write() as conn:
        await store.log(conn, decision_id="dec_b", at=now + timedelta(seconds=2), decision="sent", detail=None,
                        incident_id="inc_1")
        await store.log(conn, decision_id="dec_a", at=now, decision="opened", detail=None, incident_id="inc_1")
        await store.log(conn, decision_id="dec_x", at=now, decision="opened", detail=None, incident_id="inc_2")
    async with db.read() as conn:
        assert [r.id for r in await store.decisions_of_incident(conn, "inc_1")] == ["dec_a", "dec_b"]


async def test_decisions_of_a_firing_include_those_of_every_incident_it_touched(db, store, clock):
    now = clock.now()
    async with db.write() as conn:
        await store.log(conn, decision_id="dec_1", at=now, decision="opened", detail=None, firing_id="fir_1",
                        incident_id="inc_1")
        await store.log(conn, decision_id="dec_2", at=now + timedelta(seconds=1), decision="sent", detail=None,
                        incident_id="inc_1", notice_id="ntc_1")
        await store.log(conn, decision_id="dec_3", at=now, decision="opened", detail=None, incident_id="inc_9")
        await store.log(conn, decision_id="dec_4", at=now, decision="suppressed", detail=None, firing_id="fir_2")
    async with db.read() as conn:
        assert [r.id for r in await store.decisions_of_firing(conn, "fir_1")] == ["dec_1", "dec_2"]
        assert [r.id for r in await store.decisions_of_firing(conn, "fir_2")] == ["dec_4"]


async def test_undecided_firings_are_the_reconciled_recent_non_legacy_ones_without_a_decision_oldest_first(
        db, store, clock):
    now = clock.now()
    await seed_schedule(db, now)

    async def firing(fid: str, at: datetime, *, reconciled: bool = True, legacy: bool = False, missed: int = 0):
        async with db.write() as conn:
            await conn.execute(firings.insert().values(
                id=fid, schedule_id="sch_1", nominal_time=at, fired_at=at, admission="ok", outcome="failed",
                missed_count=missed, reconciled_at=at if reconciled else None, legacy=legacy))

    await firing("fir_new", now - timedelta(minutes=1))
    await firing("fir_old", now - timedelta(minutes=2))
    await firing("fir_ancient", now - timedelta(days=3))
    await firing("fir_open", now - timedelta(minutes=3), reconciled=False)
    await firing("fir_legacy", now - timedelta(minutes=4), legacy=True)
    await firing("fir_done", now - timedelta(minutes=5))
    await firing("fir_missed", now - timedelta(minutes=6), missed=3)
    async with db.write() as conn:
        await store.log(conn, decision_id="dec_1", at=now, decision="opened", detail=None, ingest_key="fir_done:0")
        await store.log(conn, decision_id="dec_2", at=now, decision="opened", detail=None, ingest_key="fir_missed:2")
    since = now - timedelta(days=1)
    async with db.read() as conn:
        rows = await store.undecided_firings(conn, since)
        assert [r.id for r in rows] == ["fir_missed", "fir_old", "fir_new"]  # fir_missed grew to 3: undecided again
        assert rows[0].creator_id == "prn_1" and rows[0].rule == "every 5m" and rows[0].type == "prompt"
        assert [r.id for r in await store.undecided_firings(conn, since, limit=1)] == ["fir_missed"]


# ---------------------------------------------------------------- what incidents are about


async def test_schedule_and_principal_name_read_what_a_notice_names(db, store, clock):
    await seed_schedule(db, clock.now(), creator="prn_ann")
    async with db.read() as conn:
        assert (await store.schedule(conn, "sch_1")).name == "nightly"
        assert await store.schedule(conn, "sch_none") is None
        assert await store.principal_name(conn, "prn_ann") == "name-prn_ann"
        assert await store.principal_name(conn, None) is None


async def test_left_unbound_by_recovery_is_true_only_for_an_unbound_result(db, store, clock):
    now = clock.now()
    await seed_schedule(db, now, "sch_a")
    await seed_schedule(db, now, "sch_b")
    async with db.write() as conn:
        await conn.execute(recovery_runs.insert().values(id="rr_1", cutoff=now, started_at=now, dry_run=False,
                                                         counts={}))
        await conn.execute(recovery_results.insert().values(schedule_id="sch_a", run_id="rr_1", outcome="unbound",
                                                            reason="r", recorded_at=now))
        await conn.execute(recovery_results.insert().values(schedule_id="sch_b", run_id="rr_1", outcome="bound",
                                                            reason="r", recorded_at=now))
    async with db.read() as conn:
        assert await store.left_unbound_by_recovery(conn, "sch_a")
        assert not await store.left_unbound_by_recovery(conn, "sch_b")
        assert not await store.left_unbound_by_recovery(conn, "sch_c")


async def test_bound_apps_are_the_active_bindings_applications_sorted_each_once(db, store, clock):
    now = clock.now()
    await seed_schedule(db, now)
    async with db.write() as conn:
        for i, (app, status) in enumerate([("cli_b", "active"), ("cli_a", "active"), ("cli_b", "active"),
                                           ("cli_c", "unlinked")]):
            await conn.execute(identity_bindings.insert().values(id=f"ib_{i}", principal_id="prn_1", app_id=app,
                                                                 open_id=f"ou_{i}", status=status, created_at=now))
    async with db.read() as conn:
        assert await store.bound_apps(conn, "prn_1") == ["cli_a", "cli_b"]
        assert await store.bound_apps(conn, "prn_nobody") == []


# ---------------------------------------------------------------- incidents


async def test_a_schedule_has_at_most_one_active_incident_a_second_open_raises(db, store, clock):
    now = clock.now()
    await open_incident(db, store, now, "inc_1")
    with pytest.raises(DecidedElsewhere):
        await open_incident(db, store, now, "inc_2")
    await open_incident(db, store, now, "inc_closed", state="closed")  # closed ones do not count
    async with db.write() as conn:
        assert (await store.lock_active(conn, "sch_1")).id == "inc_1"
        assert await store.lock_active(conn, "sch_other") is None


async def test_save_writes_the_rule_state_and_closing_frees_the_schedule_for_a_new_incident(db, store, clock):
    now = clock.now()
    await open_incident(db, store, now, "inc_1")
    async with db.write() as conn:
        await store.save(conn, "inc_1", values(now, "closed", failures=3, closed_at=now))
    await open_incident(db, store, now, "inc_2")
    async with db.read() as conn:
        row = await store.get(conn, "inc_1")
        assert row.state == "closed" and row.failures == 3 and row.active_key is None
        assert (await store.get(conn, "inc_2")).active_key == "sch_1"


async def test_lock_if_active_is_none_for_a_closed_incident_and_skips_one_another_replica_holds(db, store, clock):
    now = clock.now()
    await open_incident(db, store, now, "inc_open")
    await open_incident(db, store, now, "inc_done", schedule_id="sch_2", state="closed")
    async with db.write() as conn:
        assert (await store.lock_if_active(conn, "inc_open")).id == "inc_open"
        assert await store.lock_if_active(conn, "inc_done") is None
    if db.is_sqlite:
        return  # one process: writers are serialized in-process, nothing to skip
    other = Database(db.url)
    try:
        async with db.write() as conn:
            await store.lock(conn, "inc_open")
            async with other.write() as conn2:
                assert await SqlIncidentStore(other).lock_if_active(conn2, "inc_open") is None
    finally:
        await other.close()


async def test_lock_waits_for_another_holder_and_then_reads_its_write(db, store, clock):
    now = clock.now()
    await open_incident(db, store, now, "inc_1")
    if db.is_sqlite:
        async with db.write() as conn:
            assert (await store.lock(conn, "inc_1")).id == "inc_1"
        return
    other = Database(db.url)
    locked, release = asyncio.Event(), asyncio.Event()

    async def holder():
        async with db.write() as conn:
            await store.lock(conn, "inc_1")
            await store.save(conn, "inc_1", values(now, "open", failures=7))
            locked.set()
            await release.wait()

    try:
        task = asyncio.create_task(holder())
        await locked.wait()
        async with other.write() as conn2:
            waiting = asyncio.create_task(SqlIncidentStore(other).lock(conn2, "inc_1"))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            release.set()
            assert (await waiting).failures == 7
        await task
    finally:
        await other.close()


async def test_active_lists_only_incidents_time_can_still_change(db, store, clock):
    now = clock.now()
    await open_incident(db, store, now, "inc_a", schedule_id="sch_a", state="pending")
    await open_incident(db, store, now, "inc_b", schedule_id="sch_b", state="recovering")
    await open_incident(db, store, now, "inc_c", schedule_id="sch_c", state="closed")
    async with db.read() as conn:
        assert sorted(r.id for r in await store.active(conn)) == ["inc_a", "inc_b"]


async def test_newest_orders_by_opening_newest_first_and_filters_active_and_limits(db, store, clock):
    now = clock.now()
    await open_incident(db, store, now, "inc_old", schedule_id="sch_a")
    await open_incident(db, store, now + timedelta(minutes=1), "inc_mid", schedule_id="sch_b", state="closed")
    await open_incident(db, store, now + timedelta(minutes=2), "inc_new", schedule_id="sch_c")
    async with db.read() as conn:
        everything = await store.newest(conn, active_only=False, limit=10)
        assert [r.id for r in everything] == ["inc_new", "inc_mid", "inc_old"]
        assert [r.id for r in await store.newest(conn, active_only=True, limit=10)] == ["inc_new", "inc_old"]
        assert [r.id for r in await store.newest(conn, active_only=False, limit=1)] == ["inc_new"]


async def test_set_acked_by_and_set_card_record_who_acknowledged_and_which_message_is_the_card(db, store, clock):
    now = clock.now()
    await open_incident(db, store, now, "inc_1")
    async with db.write() as conn:
        await store.set_acked_by(conn, "inc_1", "ou_boss")
        await store.set_card(conn, "inc_1", "om_card", now)
    async with db.read() as conn:
        assert (await store.get(conn, "inc_1")).acked_by == "ou_boss"
        card = await store.card(conn, "inc_1")
        assert card.card_message_id == "om_card" and utc(card.card_sent_at) == now
        assert await store.card(conn, "inc_gone") is None


async def test_forget_cards_of_app_clears_card_ack_and_snooze_of_that_application_only(db, store, clock):
    now = clock.now()
    kw = {"acked_at": now, "acked_by": "ou_old", "snoozed_until": now + timedelta(hours=1),
          "card_message_id": "om_1", "card_sent_at": now}
    await open_incident(db, store, now, "inc_mine", schedule_id="sch_a", **kw)
    await open_incident(db, store, now, "inc_closed", schedule_id="sch_b", state="closed", **kw)
    await open_incident(db, store, now, "inc_theirs", schedule_id="sch_c", app_id="cli_other", **kw)
    async with db.write() as conn:
        assert sorted(r.id for r in await store.of_app(conn, APP)) == ["inc_closed", "inc_mine"]
        await store.forget_cards_of_app(conn, APP, now)
    async with db.read() as conn:
        for iid in ("inc_mine", "inc_closed"):
            r = await store.get(conn, iid)
            assert (r.card_message_id, r.card_sent_at, r.acked_at, r.acked_by, r.snoozed_until) == (None,) * 5
        assert (await store.get(conn, "inc_theirs")).card_message_id == "om_1"


async def test_in_app_and_count_active_in_app_see_only_that_applications_incidents(db, store, clock):
    now = clock.now()
    await open_incident(db, store, now, "inc_1", schedule_id="sch_a")
    await open_incident(db, store, now, "inc_2", schedule_id="sch_b", state="closed")
    await open_incident(db, store, now, "inc_3", schedule_id="sch_c", app_id="cli_other")
    async with db.read() as conn:
        assert await store.in_app(conn, "inc_1", APP) and await store.in_app(conn, "inc_2", APP)
        assert not await store.in_app(conn, "inc_3", APP) and not await store.in_app(conn, "inc_none", APP)
        assert await store.count_active_in_app(conn, APP) == 1


async def test_active_page_in_app_is_newest_first_with_names_and_pages_by_offset(db, store, clock):
    now = clock.now()
    await seed_schedule(db, now, "sch_a", creator="prn_ann", name="alpha")
    for i, sid in enumerate(["sch_a", "sch_gone", "sch_c"]):
        await open_incident(db, store, now + timedelta(minutes=i), f"inc_{i}", schedule_id=sid,
                            creator="prn_ann" if sid == "sch_a" else None)
    await open_incident(db, store, now + timedelta(minutes=9), "inc_closed", schedule_id="sch_z", state="closed")
    async with db.read() as conn:
        page = await store.active_page_in_app(conn, APP, offset=0, limit=2)
        assert [r.id for r in page] == ["inc_2", "inc_1"]
        assert page[0].schedule_name is None and page[0].creator_name is None
        rest = await store.active_page_in_app(conn, APP, offset=2, limit=2)
        assert [(r.id, r.schedule_name, r.creator_name) for r in rest] == [("inc_0", "alpha", "name-prn_ann")]


# ---------------------------------------------------------------- Feishu applications


async def test_add_app_starts_at_epoch_zero_and_change_admin_moves_the_epoch_up_by_one(db, store, clock):
    now = clock.now()
    await add_app(db, store, now, admin="ou_a")
    later = now + timedelta(hours=1)
    async with db.write() as conn:
        assert (await store.lock_app(conn, APP)).admin_epoch == 0
        await store.change_admin(conn, APP, admin_open_id="ou_b", delivery_state="ok", diagnostic=None,
                                 timezone="Asia/Shanghai", now=later)
    async with db.read() as conn:
        app = await store.app(conn, APP)
        assert (app.admin_open_id, app.admin_epoch, app.timezone) == ("ou_b", 1, "Asia/Shanghai")
        assert utc(app.admin_changed_at) == later
        assert await store.admin_of(conn, APP) == "ou_b"
        assert await store.admin_of(conn, "cli_unknown") is None
        assert await store.app(conn, "cli_unknown") is None


async def test_set_timezone_and_set_delivery_write_only_their_fields(db, store, clock):
    now = clock.now()
    await add_app(db, store, now)
    async with db.write() as conn:
        await store.set_timezone(conn, APP, "Europe/Berlin", now)
        await store.set_delivery(conn, APP, "suspended", "blocked: recheck", now)
    async with db.read() as conn:
        app = await store.app(conn, APP)
        assert (app.timezone, app.delivery_state, app.diagnostic, app.admin_open_id) == (
            "Europe/Berlin", "suspended", "blocked: recheck", "ou_admin")


async def test_apps_not_ok_are_the_unconfigured_and_suspended_ones(db, store, clock):
    now = clock.now()
    await add_app(db, store, now, "cli_ok")
    await add_app(db, store, now, "cli_none", admin=None, state="unconfigured")
    await add_app(db, store, now, "cli_susp", state="suspended")
    async with db.read() as conn:
        assert sorted(a.app_id for a in await store.apps_not_ok(conn)) == ["cli_none", "cli_susp"]


async def test_lock_apps_answers_the_known_applications_by_id(db, store, clock):
    now = clock.now()
    await add_app(db, store, now, "cli_b")
    await add_app(db, store, now, "cli_a")
    async with db.write() as conn:
        apps = await store.lock_apps(conn, ["cli_b", "cli_a", "cli_b", "cli_unknown"])
    assert sorted(apps) == ["cli_a", "cli_b"] and apps["cli_a"].admin_open_id == "ou_admin"


# ---------------------------------------------------------------- the outbox


async def test_a_notice_is_written_pending_with_its_id_as_request_uuid(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_1", due=now + timedelta(seconds=5))
    row = await notice(db, "ntc_1")
    assert (row.state, row.request_uuid, row.attempts, utc(row.next_attempt_at)) == (LIVE, "ntc_1", 0,
                                                                                     now + timedelta(seconds=5))


async def test_supersede_updates_ends_only_the_incidents_unclaimed_pending_updates(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_free", kind="update", incident_id="inc_1")
    await add_notice(db, box, now, "ntc_claimed", kind="update", incident_id="inc_1")
    await add_notice(db, box, now, "ntc_card", kind="card", incident_id="inc_1")
    await add_notice(db, box, now, "ntc_other", kind="update", incident_id="inc_2")
    async with db.write() as conn:
        await box.claim(conn, "ntc_claimed", worker="w", until=now + timedelta(seconds=30), recipient="ou_admin",
                        first_attempt_at=now, slot_at=None)
        await box.supersede_updates(conn, "inc_1")
    states = {n: (await notice(db, n)).state for n in ("ntc_free", "ntc_claimed", "ntc_card", "ntc_other")}
    assert states == {"ntc_free": "superseded", "ntc_claimed": LIVE, "ntc_card": LIVE, "ntc_other": LIVE}


async def test_any_due_looks_for_a_pending_notice_due_now(db, box, clock):
    now = clock.now()
    async with db.read() as conn:
        assert not await box.any_due(conn, now)
    await add_notice(db, box, now, "ntc_later", due=now + timedelta(seconds=10))
    async with db.read() as conn:
        assert not await box.any_due(conn, now)
        assert await box.any_due(conn, now + timedelta(seconds=10))


async def test_lock_due_takes_due_notices_with_free_or_expired_claims_earliest_first_up_to_limit(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_b", due=now - timedelta(seconds=1))
    await add_notice(db, box, now, "ntc_a", due=now - timedelta(seconds=2))
    await add_notice(db, box, now, "ntc_future", due=now + timedelta(seconds=1))
    await add_notice(db, box, now, "ntc_held", due=now - timedelta(seconds=3))
    await add_notice(db, box, now, "ntc_expired", due=now - timedelta(seconds=4))
    await add_notice(db, box, now, "ntc_sent", due=now - timedelta(seconds=5))
    async with db.write() as conn:
        await box.claim(conn, "ntc_held", worker="w", until=now + timedelta(seconds=5), recipient="ou_admin",
                        first_attempt_at=now, slot_at=None)
        await box.claim(conn, "ntc_expired", worker="w", until=now - timedelta(seconds=1), recipient="ou_admin",
                        first_attempt_at=now, slot_at=None)
        await conn.execute(outbox.update().where(outbox.c.id == "ntc_sent").values(state="sent"))
    async with db.write() as conn:
        assert [r.id for r in await box.lock_due(conn, now, 10)] == ["ntc_expired", "ntc_a", "ntc_b"]
    async with db.write() as conn:
        assert [r.id for r in await box.lock_due(conn, now, 1)] == ["ntc_expired"]


async def test_lock_due_skips_notices_another_replica_has_locked(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_1", due=now - timedelta(seconds=2))
    await add_notice(db, box, now, "ntc_2", due=now - timedelta(seconds=1))
    if db.is_sqlite:  # one process: the in-process writer lock serializes the two claims instead
        async with db.write() as conn:
            assert len(await box.lock_due(conn, now, 10)) == 2
        return
    other = Database(db.url)
    try:
        async with db.write() as conn:
            assert [r.id for r in await box.lock_due(conn, now, 1)] == ["ntc_1"]
            async with other.write() as conn2:
                assert [r.id for r in await SqlOutboxStore(other).lock_due(conn2, now, 10)] == ["ntc_2"]
    finally:
        await other.close()


async def test_claim_leases_a_notice_and_records_a_slot_only_when_it_pings(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_ping", recipient=None)
    await add_notice(db, box, now, "ntc_quiet", kind="update")
    async with db.write() as conn:
        await box.claim(conn, "ntc_ping", worker="w1", until=now + timedelta(seconds=30), recipient="ou_admin",
                        first_attempt_at=now, slot_at=now)
        await box.claim(conn, "ntc_quiet", worker="w1", until=now + timedelta(seconds=30), recipient="ou_admin",
                        first_attempt_at=now, slot_at=None)
    ping, quiet = await notice(db, "ntc_ping"), await notice(db, "ntc_quiet")
    assert (ping.claimed_by, ping.recipient, utc(ping.slot_at)) == ("w1", "ou_admin", now)
    assert utc(ping.claimed_until) == now + timedelta(seconds=30) and utc(ping.first_attempt_at) == now
    assert quiet.claimed_by == "w1" and quiet.slot_at is None


async def test_claim_many_leases_every_notice_in_one_statement_and_only_pinging_ones_take_a_new_slot(db, box, clock):
    now = clock.now()
    earlier = now - timedelta(minutes=5)
    until = now + timedelta(seconds=30)
    for nid in ("ntc_ping", "ntc_quiet", "ntc_kept", "ntc_other"):
        await add_notice(db, box, now, nid, recipient=None)
    async with db.write() as conn:
        await box.claim(conn, "ntc_kept", worker="w0", until=earlier, recipient="ou_admin", first_attempt_at=earlier,
                        slot_at=earlier)
        await box.claim_many(conn, [], worker="w1", until=until)
        await box.claim_many(conn, [
            NoticeClaim(notice_id="ntc_ping", recipient="ou_admin", first_attempt_at=now, slot_at=now),
            NoticeClaim(notice_id="ntc_quiet", recipient="ou_other", first_attempt_at=now),
            NoticeClaim(notice_id="ntc_kept", recipient="ou_admin", first_attempt_at=earlier)],
            worker="w1", until=until)
    ping, quiet, kept, other = [await notice(db, n) for n in ("ntc_ping", "ntc_quiet", "ntc_kept", "ntc_other")]
    assert (ping.claimed_by, utc(ping.claimed_until), ping.recipient, utc(ping.first_attempt_at),
            utc(ping.slot_at)) == ("w1", until, "ou_admin", now, now)
    assert (quiet.claimed_by, quiet.recipient, quiet.slot_at) == ("w1", "ou_other", None)
    assert (kept.claimed_by, utc(kept.first_attempt_at), utc(kept.slot_at)) == ("w1", earlier, earlier)
    assert (other.claimed_by, other.recipient) == (None, None)


async def test_record_sent_round_marks_only_the_notices_the_worker_still_holds_pending(db, box, clock):
    now = clock.now()
    for nid in ("ntc_1", "ntc_2", "ntc_theirs", "ntc_done"):
        await add_notice(db, box, now, nid)
    async with db.write() as conn:
        await box.claim_many(conn, [NoticeClaim(notice_id=n, recipient="ou_admin", first_attempt_at=now)
                                    for n in ("ntc_1", "ntc_2", "ntc_done")], worker="w1", until=now)
        await box.claim(conn, "ntc_theirs", worker="w2", until=now, recipient="ou_admin", first_attempt_at=now,
                        slot_at=None)
        await conn.execute(outbox.update().where(outbox.c.id == "ntc_done").values(state="dead"))
        assert await box.record_sent_round(conn, "w1", [], now) == set()
        got = await box.record_sent_round(conn, "w1", [
            NoticeSent(notice_id="ntc_1", message_id="om_1", attempts=1),
            NoticeSent(notice_id="ntc_2", message_id="om_2", attempts=3),
            NoticeSent(notice_id="ntc_theirs", message_id="om_x", attempts=1),
            NoticeSent(notice_id="ntc_done", message_id="om_y", attempts=1)], now)
    assert got == {"ntc_1", "ntc_2"}
    one, two, theirs, done = [await notice(db, n) for n in ("ntc_1", "ntc_2", "ntc_theirs", "ntc_done")]
    assert (one.state, one.message_id, one.attempts, one.claimed_by, one.claimed_until, utc(one.sent_at)) == (
        "sent", "om_1", 1, None, None, now)
    assert (two.state, two.message_id, two.attempts) == ("sent", "om_2", 3)
    assert (theirs.state, theirs.message_id, theirs.claimed_by) == (LIVE, None, "w2")
    assert (done.state, done.message_id) == ("dead", None)


async def test_a_late_record_round_from_an_expired_claim_changes_nothing_for_the_new_owner(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_1")
    async with db.write() as conn:
        await box.claim_many(conn, [NoticeClaim(notice_id="ntc_1", recipient="ou_admin", first_attempt_at=now)],
                             worker="w1", until=now + timedelta(seconds=30))
    later = now + timedelta(seconds=31)
    async with db.write() as conn:  # w1's lease expired: w2 takes the notice over
        assert [r.id for r in await box.lock_due(conn, later, 10)] == ["ntc_1"]
        await box.claim_many(conn, [NoticeClaim(notice_id="ntc_1", recipient="ou_admin", first_attempt_at=now)],
                             worker="w2", until=later + timedelta(seconds=30))
    async with db.write() as conn:  # w1's answer arrives late
        assert await box.lock_held(conn, ["ntc_1"], "w1") == set()
        assert await box.record_sent_round(conn, "w1", [NoticeSent(notice_id="ntc_1", message_id="om_late",
                                                                   attempts=1)], later) == set()
    row = await notice(db, "ntc_1")
    assert (row.state, row.claimed_by, row.message_id, row.attempts) == (LIVE, "w2", None, 0)
    async with db.write() as conn:
        assert await box.lock_held(conn, ["ntc_1", "ntc_unknown"], "w2") == {"ntc_1"}


async def test_lock_held_locks_the_notices_so_another_replica_waits_to_write_them(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_1")
    async with db.write() as conn:
        await box.claim_many(conn, [NoticeClaim(notice_id="ntc_1", recipient="ou_admin", first_attempt_at=now)],
                             worker="w1", until=now)
    if db.is_sqlite:  # one process: the in-process writer lock serializes the two transactions instead
        async with db.write() as conn:
            assert await box.lock_held(conn, ["ntc_1"], "w1") == {"ntc_1"}
        return
    other = Database(db.url)
    try:
        async with db.write() as conn:
            assert await box.lock_held(conn, ["ntc_1"], "w1") == {"ntc_1"}
            async with other.write() as conn2:  # an expired claim is due, but the row is locked: skipped
                assert await SqlOutboxStore(other).lock_due(conn2, now + timedelta(seconds=1), 10) == []
    finally:
        await other.close()


async def test_slots_since_lists_the_slots_taken_after_the_cutoff_in_those_applications(db, box, clock):
    now = clock.now()
    for nid, app, at in [("ntc_old", APP, now - timedelta(hours=1)), ("ntc_new", APP, now),
                         ("ntc_else", "cli_other", now)]:
        await add_notice(db, box, now, nid, app_id=app)
        async with db.write() as conn:
            await box.claim(conn, nid, worker="w", until=now, recipient="ou_admin", first_attempt_at=now, slot_at=at)
    async with db.read() as conn:
        got = await box.slots_since(conn, [APP], now - timedelta(minutes=30))
    assert [(a, r, nid, utc(at)) for a, r, nid, at in got] == [(APP, "ou_admin", "ntc_new", now)]


async def test_defer_retire_fold_and_hold_each_write_their_outcome(db, box, clock):
    now = clock.now()
    for nid in ("ntc_d", "ntc_r", "ntc_f", "ntc_h"):
        await add_notice(db, box, now, nid)
    later = now + timedelta(hours=8)
    async with db.write() as conn:
        await box.defer(conn, "ntc_d", later)
        await box.retire(conn, "ntc_r")
        await box.fold(conn, "ntc_f", "ntc_digest")
        await box.hold(conn, "ntc_h", later, "no administrator")
    d, r, f, h = [await notice(db, n) for n in ("ntc_d", "ntc_r", "ntc_f", "ntc_h")]
    assert d.state == LIVE and utc(d.next_attempt_at) == later
    assert r.state == "retired"
    assert (f.state, f.digest_id) == ("folded", "ntc_digest")
    assert (h.state, utc(h.next_attempt_at), h.last_error) == (LIVE, later, "no administrator")


async def test_open_digest_is_the_recipients_pending_digest_never_attempted(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_tried", kind="digest")
    async with db.write() as conn:
        await box.claim(conn, "ntc_tried", worker="w", until=now, recipient="ou_admin", first_attempt_at=now,
                        slot_at=None)
    async with db.read() as conn:
        assert await box.open_digest(conn, APP, "ou_admin") is None
    await add_notice(db, box, now, "ntc_open", kind="digest", payload={"items": [1]})
    await add_notice(db, box, now, "ntc_else", kind="digest", recipient="ou_other")
    async with db.write() as conn:
        row = await box.open_digest(conn, APP, "ou_admin")
        assert (row.id, row.payload) == ("ntc_open", {"items": [1]})
        await box.set_payload(conn, "ntc_open", {"items": [1, 2]})
    assert (await notice(db, "ntc_open")).payload == {"items": [1, 2]}


async def test_release_and_finish_change_a_notice_only_for_the_worker_holding_its_claim(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_r")
    await add_notice(db, box, now, "ntc_f")
    async with db.write() as conn:
        for nid in ("ntc_r", "ntc_f"):
            await box.claim(conn, nid, worker="w1", until=now + timedelta(seconds=30), recipient="ou_admin",
                            first_attempt_at=now, slot_at=now)
        await box.release(conn, "ntc_r", "w2", now)
        await box.finish(conn, "ntc_f", "w2", "superseded")
    assert (await notice(db, "ntc_r")).claimed_by == "w1" and (await notice(db, "ntc_f")).state == LIVE
    later = now + timedelta(seconds=5)
    async with db.write() as conn:
        await box.release(conn, "ntc_r", "w1", later)
        await box.finish(conn, "ntc_f", "w1", "superseded")
    r, f = await notice(db, "ntc_r"), await notice(db, "ntc_f")
    assert (r.claimed_by, r.claimed_until, r.slot_at, utc(r.next_attempt_at)) == (None, None, None, later)
    assert (f.state, f.claimed_by) == ("superseded", None)


async def test_record_sent_counts_only_while_the_worker_holds_the_pending_notice(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_1")
    async with db.write() as conn:
        await box.claim(conn, "ntc_1", worker="w1", until=now, recipient="ou_admin", first_attempt_at=now, slot_at=None)
        assert not await box.record_sent(conn, "ntc_1", "w2", message_id="om_late", attempts=1, now=now)
        assert await box.record_sent(conn, "ntc_1", "w1", message_id="om_1", attempts=1, now=now)
    row = await notice(db, "ntc_1")
    assert (row.state, row.message_id, row.attempts, row.claimed_by, utc(row.sent_at)) == ("sent", "om_1", 1, None, now)
    async with db.write() as conn:  # sent is terminal: a repeat changes nothing
        assert not await box.record_sent(conn, "ntc_1", "w1", message_id="om_2", attempts=2, now=now)


async def test_record_failure_keeps_the_holder_rule_truncates_the_error_and_a_new_window_forgets_the_first_attempt(
        db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_retry")
    await add_notice(db, box, now, "ntc_susp")
    async with db.write() as conn:
        for nid in ("ntc_retry", "ntc_susp"):
            await box.claim(conn, nid, worker="w1", until=now, recipient="ou_admin", first_attempt_at=now, slot_at=now)
        assert not await box.record_failure(conn, "ntc_retry", "w2", state=LIVE, attempts=1, error="x",
                                            next_attempt_at=None)
        assert await box.record_failure(conn, "ntc_retry", "w1", state=LIVE, attempts=1, error="e" * 3000,
                                        next_attempt_at=now + timedelta(seconds=2))
        assert await box.record_failure(conn, "ntc_susp", "w1", state=LIVE, attempts=1, error="230013",
                                        next_attempt_at=now + timedelta(minutes=1), new_window=True)
    r, s = await notice(db, "ntc_retry"), await notice(db, "ntc_susp")
    assert (r.attempts, len(r.last_error), r.claimed_by, utc(r.first_attempt_at), utc(r.slot_at)) == (
        1, 2000, None, now, now)
    assert utc(r.next_attempt_at) == now + timedelta(seconds=2)
    assert (s.first_attempt_at, s.slot_at, s.last_error) == (None, None, "230013")


async def test_make_held_due_makes_the_unclaimed_pending_notices_of_the_application_due_now(db, box, clock):
    now = clock.now()
    later = now + timedelta(hours=1)
    for nid, app in [("ntc_1", APP), ("ntc_2", APP), ("ntc_claimed", APP), ("ntc_else", "cli_other")]:
        await add_notice(db, box, now, nid, app_id=app, due=later)
    async with db.write() as conn:
        await box.hold(conn, "ntc_1", later, "suspended")
        await box.claim(conn, "ntc_claimed", worker="w", until=later, recipient="ou_admin", first_attempt_at=now,
                        slot_at=None)
        assert await box.make_held_due(conn, APP, now) == 2
    one = await notice(db, "ntc_1")
    assert utc(one.next_attempt_at) == now and one.last_error is None
    assert utc((await notice(db, "ntc_claimed")).next_attempt_at) == later
    assert utc((await notice(db, "ntc_else")).next_attempt_at) == later


async def test_retire_live_of_app_retires_every_pending_notice_and_drops_claims(db, box, clock):
    now = clock.now()
    for nid, app in [("ntc_1", APP), ("ntc_2", APP), ("ntc_else", "cli_other")]:
        await add_notice(db, box, now, nid, app_id=app)
    async with db.write() as conn:
        await box.claim(conn, "ntc_2", worker="w", until=now, recipient="ou_admin", first_attempt_at=now, slot_at=None)
        assert sorted(r.id for r in await box.live_of_app(conn, APP)) == ["ntc_1", "ntc_2"]
        await box.retire_live_of_app(conn, APP)
    for nid in ("ntc_1", "ntc_2"):
        row = await notice(db, nid)
        assert (row.state, row.claimed_by, row.claimed_until) == ("retired", None, None)
    assert (await notice(db, "ntc_else")).state == LIVE


async def test_of_incident_lists_its_notices_oldest_first_and_card_pending_sees_a_pending_card(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now + timedelta(seconds=1), "ntc_upd", kind="update", incident_id="inc_1")
    await add_notice(db, box, now, "ntc_card", kind="card", incident_id="inc_1")
    async with db.read() as conn:
        assert [r.id for r in await box.of_incident(conn, "inc_1")] == ["ntc_card", "ntc_upd"]
        assert await box.card_pending(conn, "inc_1")
        assert not await box.card_pending(conn, "inc_2")
    async with db.write() as conn:
        await box.retire(conn, "ntc_card")
    async with db.read() as conn:
        assert not await box.card_pending(conn, "inc_1")


async def test_troubled_lists_unconfirmed_and_dead_notices_up_to_limit(db, box, clock):
    now = clock.now()
    for nid, state in [("ntc_u", "unconfirmed"), ("ntc_d", "dead"), ("ntc_s", "sent"), ("ntc_p", LIVE)]:
        await add_notice(db, box, now, nid)
        async with db.write() as conn:
            await conn.execute(outbox.update().where(outbox.c.id == nid).values(state=state))
    async with db.read() as conn:
        assert sorted(r.id for r in await box.troubled(conn)) == ["ntc_d", "ntc_u"]
        assert len(await box.troubled(conn, limit=1)) == 1


async def test_was_sent_to_says_whether_a_notice_of_the_incident_was_addressed_to_that_recipient(db, box, clock):
    now = clock.now()
    await add_notice(db, box, now, "ntc_1", kind="card", incident_id="inc_1", recipient="ou_old")
    async with db.read() as conn:
        assert await box.was_sent_to(conn, "inc_1", APP, "ou_old")
        assert not await box.was_sent_to(conn, "inc_1", APP, "ou_new")
        assert not await box.was_sent_to(conn, "inc_1", "cli_other", "ou_old")


async def test_incident_rows_keep_their_columns(db, store, clock):
    """The store writes every rule field: reading an incident back gives the values it was opened with."""
    now = clock.now()
    await open_incident(db, store, now, "inc_1", failures=4, missed=2, unknowns=1, notify_at=now)
    async with db.read() as conn:
        row = (await conn.execute(sa.select(incidents).where(incidents.c.id == "inc_1"))).first()
    assert (row.failures, row.missed, row.unknowns, utc(row.notify_at), row.kind) == (4, 2, 1, now, "schedule")
