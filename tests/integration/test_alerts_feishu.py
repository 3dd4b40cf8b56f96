"""Alert pipeline end to end: real schedules and firings → incidents → outbox → real lark-oapi → fake Feishu.

Time is the injected clock (the fake server reads it too, for its one-hour uuid dedup); rounds run by hand.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.ids import new_id
from hub.services.schedules.service import ScheduleSpec
from hub.store.db import Database
from hub.store.tables import firings, identity_bindings, outbox, runtimes, schedules, task_runs
from tests.fakes.feishu import FakeFeishu, card_text, clock_seconds
from tests.helpers import hub_settings

ADMIN = "ou_admin"


@pytest.fixture
async def fake(clock: ManualClock):
    f = await FakeFeishu(now=clock_seconds(clock)).start()
    yield f
    await f.stop()


class Env:
    """A hub (no background loops) with one Feishu app, a creator bound to it, and a schedule."""

    def __init__(self, hub: Hub, fake: FakeFeishu, clock: ManualClock) -> None:
        self.hub, self.fake, self.clock = hub, fake, clock
        self.sid: str | None = None

    async def setup(self, rule: str = "every 5m", name: str = "nightly build") -> "Env":
        token = await self.hub.auth.create_token("alice")
        self.alice = await self.hub.auth.authenticate(token)
        now = self.clock.now()
        async with self.hub.db.write() as conn:
            await conn.execute(identity_bindings.insert().values(
                id=new_id("ib"), principal_id=self.alice.principal_id, app_id=self.fake.app_id, open_id="ou_alice",
                status="active", created_at=now))
            await conn.execute(runtimes.insert().values(
                id=new_id("rt"), name="r1", principal_id=self.alice.principal_id, shared=True,
                capabilities={"engines": ["scripted"]}, slots=4, status="online", registered_at=now, last_seen_at=now))
        s = await self.hub.schedules.create(self.alice, ScheduleSpec(prompt="say hello", rule=rule, name=name,
                                                                     schedule_type="subtask",
                                                                     timezone="Asia/Shanghai"))
        self.sid = s["schedule_id"]
        return self

    async def fire(self, outcome: str, advance_s: float = 300) -> str:
        """Let the schedule fire once, finish its Task with `outcome`, reconcile; return the firing id."""
        self.clock.advance(advance_s)
        async with self.hub.db.write() as conn:  # fire now (tests move the clock in big steps; no missed runs)
            await conn.execute(schedules.update().where(schedules.c.id == self.sid)
                               .values(next_fire_at=self.clock.now()))
        await self.hub.schedule_firing.fire_due()
        async with self.hub.db.write() as conn:
            row = (await conn.execute(sa.select(firings).where(firings.c.schedule_id == self.sid)
                                      .order_by(firings.c.nominal_time.desc()).limit(1))).first()
            if row.task_id and outcome != "unknown":
                await conn.execute(task_runs.update().where(task_runs.c.id == row.task_id).values(status=outcome))
            elif outcome == "unknown":
                await conn.execute(task_runs.delete().where(task_runs.c.id == row.task_id))
        await self.hub.schedule_firing.reconcile()
        return row.id

    async def round(self, advance_s: float = 0) -> None:
        self.clock.advance(advance_s)
        await self.hub.alerts.tick()

    async def notices(self) -> list:
        async with self.hub.db.read() as conn:
            return (await conn.execute(sa.select(outbox).order_by(outbox.c.created_at))).all()


async def make_env(db_url: str, tmp: Path, clock: ManualClock, fake: FakeFeishu, admin: str | None = ADMIN,
                   **alerts) -> Env:
    settings = hub_settings(db_url, tmp)
    settings.feishu.apps = [FeishuAppSettings(app_id=fake.app_id, app_secret=fake.app_secret, admin_open_id=admin,
                                              base_url=fake.base_url, timezone="Asia/Shanghai")]
    settings.alerts.retry_base_s = 1
    for k, v in alerts.items():
        setattr(settings.alerts, k, v)
    return Env(Hub(settings, Database(db_url), clock), fake, clock)


@pytest.fixture
async def env(db_url: str, tmp_path: Path, clock: ManualClock, fake: FakeFeishu):
    e = await make_env(db_url, tmp_path, clock, fake)
    await e.setup()
    yield e
    await e.hub.db.close()


async def test_failure_sends_one_card_to_the_admin_after_60s_with_creator_attribution(db_url, tmp_path, clock, fake):
    env = await make_env(db_url, tmp_path, clock, fake)
    await env.setup(rule="every 30s")
    await env.fire("failed", advance_s=30)
    await env.round()
    assert env.fake.sent == []                      # still aggregating
    await env.fire("failed", advance_s=30)          # a second failure inside the window joins the same card
    await env.round()
    assert env.fake.sent == []
    await env.round(30)
    assert len(env.fake.sent) == 1
    m = env.fake.sent[0]
    assert m.receive_id == ADMIN                    # the administrator, never the creator or anyone else
    text = card_text(m.content)
    assert "alice" in text and "nightly build" in text and "Failures** 2" in text
    assert "爱" not in text and "创建者" in card_text(m.content, "zh_cn")
    assert m.content["schema"] == "2.0" and not any(e.get("tag") == "action" for e in m.content["body"]["elements"])
    await env.hub.db.close()


async def test_later_failures_patch_the_card_and_remind_at_most_once_a_day(env: Env):
    await env.fire("failed")
    await env.round(61)
    card = env.fake.sent[0].message_id
    await env.fire("failed")
    await env.round()
    assert len(env.fake.sent) == 1 and env.fake.patches and env.fake.patches[-1][0] == card
    assert "Failures** 2" in card_text(env.fake.patches[-1][1])
    await env.round(86400)                          # a day after the card
    reminders = [m for m in env.fake.sent if m.reply_to == card]
    assert len(reminders) == 1
    await env.round(3600)
    assert len([m for m in env.fake.sent if m.reply_to == card]) == 1   # no second reminder the same day


async def test_acknowledge_stops_reminders_and_snooze_lasts_24h(env: Env):
    await env.fire("failed")
    await env.round(61)
    inc = (await env.hub.alerts.list_incidents())[0]["id"]
    await env.hub.alerts.acknowledge(inc, "boss")
    await env.round(3 * 86400)
    assert [m for m in env.fake.sent if m.reply_to] == []
    assert "Acknowledged" in card_text(env.fake.patches[-1][1])


async def test_recovery_closes_the_card_after_10_stable_minutes(env: Env):
    await env.fire("failed")
    await env.round(61)
    await env.fire("succeeded")
    await env.round()
    assert "Recovering" in card_text(env.fake.patches[-1][1])
    await env.round(599 - 0)
    assert "Recovered" not in card_text(env.fake.patches[-1][1])
    await env.round(1)
    assert "Recovered" in card_text(env.fake.patches[-1][1])
    assert await env.hub.alerts.list_incidents() == []
    assert len(env.fake.sent) == 1


async def test_recurring_success_is_quiet(env: Env):
    fid = await env.fire("succeeded")
    await env.round(3600)
    assert env.fake.sent == [] and env.fake.patches == []
    assert (await env.hub.alerts.explain(fid))["decisions"][0]["decision"] == "quiet_success"


async def test_unknown_outcome_waits_5_minutes(env: Env):
    await env.fire("unknown")
    await env.round(299)
    assert env.fake.sent == []
    await env.round(1)
    assert len(env.fake.sent) == 1 and "Unknown** 1" in card_text(env.fake.sent[0].content)


async def test_one_shot_terminal_outcome_gets_a_receipt(db_url, tmp_path, clock, fake):
    e = await make_env(db_url, tmp_path, clock, fake)
    at = (clock.now() + timedelta(minutes=5)).isoformat()
    await e.setup(rule=f"at {at}", name="release")
    await e.fire("succeeded")
    await e.round()
    assert len(fake.sent) == 1 and "finished: release" in card_text(fake.sent[0].content)
    assert "alice" in card_text(fake.sent[0].content)
    await e.hub.db.close()


async def test_quiet_hours_defer_new_messages_to_0800(db_url, tmp_path, clock, fake):
    clock.set(datetime(2026, 1, 5, 13, 59, 30, tzinfo=timezone.utc))  # 21:59:30 in Shanghai
    e = await make_env(db_url, tmp_path, clock, fake)
    await e.setup()
    await e.fire("failed", advance_s=0)
    await e.round(61)                                                    # 22:00:31: the card is due, but quiet
    await e.round(300)
    assert fake.sent == []
    notice = (await e.notices())[0]
    assert notice.next_attempt_at.replace(tzinfo=timezone.utc) == datetime(2026, 1, 6, 0, 0, tzinfo=timezone.utc)
    clock.set(datetime(2026, 1, 6, 0, 0, tzinfo=timezone.utc))           # 08:00 local
    await e.round()
    assert len(fake.sent) == 1                                           # deferred, never dropped
    await e.hub.db.close()


async def test_quiet_hours_follow_the_scheduling_timezone_which_a_chat_schedule_takes_from_its_app(
        db_url, tmp_path, clock, fake):
    clock.set(datetime(2026, 1, 5, 15, 0, tzinfo=timezone.utc))        # 23:00 in Shanghai, 15:00 in UTC
    e = await make_env(db_url, tmp_path, clock, fake)                   # the app's timezone: Asia/Shanghai
    await e.setup(rule="every 1d")
    async with e.hub.db.read() as conn:
        bid = (await conn.execute(sa.select(identity_bindings.c.id)
                                  .where(identity_bindings.c.open_id == "ou_alice"))).scalar()
    chat = await e.hub.schedules.create(e.alice, ScheduleSpec(prompt="say hi", rule="every 1d", name="from chat"),
                                        source="feishu", card_receipt={"binding_id": bid, "app_id": fake.app_id,
                                                                       "open_id": "ou_alice"})
    plain = await e.hub.schedules.create(e.alice, ScheduleSpec(prompt="say hi", rule="every 1d", name="over mcp"))
    assert (chat["timezone"], plain["timezone"]) == ("Asia/Shanghai", "UTC")  # no timezone given to either
    e.sid = chat["schedule_id"]
    await e.fire("failed", advance_s=0)
    e.sid = plain["schedule_id"]
    await e.fire("failed", advance_s=0)
    await e.round(61)
    assert [card_text(m.content).count("over mcp") for m in fake.sent] == [1]   # 15:01 UTC: not quiet in UTC
    quiet = [n for n in await e.notices() if n.schedule_id == chat["schedule_id"]]
    assert [n.next_attempt_at.replace(tzinfo=timezone.utc) for n in quiet] == [
        datetime(2026, 1, 6, 0, 0, tzinfo=timezone.utc)]                # deferred to 08:00 in Shanghai
    clock.set(datetime(2026, 1, 6, 0, 0, tzinfo=timezone.utc))
    await e.round()
    assert len(fake.sent) == 2 and "from chat" in card_text(fake.sent[1].content)
    await e.hub.db.close()


async def test_quiet_hours_allow_in_place_updates(db_url, tmp_path, clock, fake):
    clock.set(datetime(2026, 1, 5, 13, 40, tzinfo=timezone.utc))       # 21:40 local
    e = await make_env(db_url, tmp_path, clock, fake)
    await e.setup()
    await e.fire("failed", advance_s=60)
    await e.round(61)
    assert len(fake.sent) == 1
    clock.set(datetime(2026, 1, 5, 15, 0, tzinfo=timezone.utc))         # 23:00 local
    await e.fire("failed", advance_s=0)
    await e.round()
    assert fake.patches and len(fake.sent) == 1
    await e.hub.db.close()


async def test_rate_limit_three_per_30min_then_digest_at_next_free_slot(db_url, tmp_path, clock, fake):
    e = await make_env(db_url, tmp_path, clock, fake)
    await e.setup(name="s0")
    sids = [e.sid]
    for i in range(1, 5):
        s = await e.hub.schedules.create(e.alice, ScheduleSpec(prompt="say hi", rule="every 5m", name=f"s{i}",
                                                                schedule_type="subtask", timezone="Asia/Shanghai"))
        sids.append(s["schedule_id"])
    clock.advance(300)
    await e.hub.schedule_firing.fire_due()
    async with e.hub.db.write() as conn:
        await conn.execute(task_runs.update().values(status="failed"))
    await e.hub.schedule_firing.reconcile()
    await e.round(61)
    assert len(fake.sent) == 3                                     # three new messages …
    states = sorted(n.state for n in await e.notices())
    assert states.count("folded") == 2 and "pending" in states    # … the rest folded into one pending digest
    await e.round(1800 - 1)
    assert len(fake.sent) == 3
    await e.round(2)
    assert len(fake.sent) == 4
    digest = fake.sent[-1]
    assert "2 scheduled task alerts" in card_text(digest.content)
    await e.hub.db.close()


async def test_transient_errors_retry_with_the_same_uuid(env: Env):
    env.fake.fail("429", op="send")
    env.fake.fail("5xx", op="send")
    env.fake.fail("nonjson", op="send")
    env.fake.fail("lost", op="send")                # accepted, but the answer never arrives intact
    await env.fire("failed")
    await env.round(61)
    for wait in (7, 2, 4, 8):                       # 429 honours x-ogw-ratelimit-reset (7 s), then backoff
        assert len([r for r in env.fake.requests if r[0] == "send"]) >= 1
        await env.round(wait)
    uuids = {r[1] for r in env.fake.requests if r[0] == "send"}
    assert len(uuids) == 1                          # every attempt carried the same request uuid
    assert len(env.fake.sent) == 1                  # and Feishu's dedup kept it to one message
    n = (await env.notices())[0]
    assert n.state == "sent" and n.message_id == env.fake.sent[0].message_id


async def test_a_retried_new_message_leaves_its_own_slot_out_of_the_rate_limit(db_url, tmp_path, clock, fake):
    e = await make_env(db_url, tmp_path, clock, fake)
    await e.setup(rule="every 1d", name="s0")
    sids = [e.sid] + [(await e.hub.schedules.create(e.alice, ScheduleSpec(
        prompt="say hi", rule="every 1d", name=f"s{i}", schedule_type="subtask", timezone="Asia/Shanghai")))
        ["schedule_id"] for i in (1, 2)]
    for sid in sids[:2]:                            # two new messages inside one 30-minute window
        e.sid = sid
        await e.fire("failed")
        await e.round(61)
    assert len(fake.sent) == 2
    fake.fail("5xx", op="send")                     # the third new message fails once, transiently
    e.sid = sids[2]
    await e.fire("failed")
    await e.round(61)
    assert len(fake.sent) == 2
    await e.round(2)                                # its retry retakes its own slot: still the third, not a fourth
    third = [r for r in fake.requests if r[0] == "send"][2:]
    assert len(third) == 2 and third[0][1] == third[1][1]   # retried once, with the same request uuid
    assert len(fake.sent) == 3
    card = fake.sent[-1]
    assert "s2" in card_text(card.content)
    notices = await e.notices()
    assert not [n for n in notices if n.kind == "digest" or n.state == "folded"]
    await e.fire("failed")                          # a later update of that incident patches its card
    await e.round()
    assert fake.patches and fake.patches[-1][0] == card.message_id
    assert "Failures** 2" in card_text(fake.patches[-1][1])
    assert not [n for n in await e.notices() if n.state == "superseded"]
    await e.hub.db.close()


async def test_retries_past_the_dedup_window_become_unconfirmed(env: Env):
    env.fake.fail("5xx", times=1000, op="send")
    await env.fire("failed")
    await env.round(61)
    for _ in range(40):
        await env.round(300)
    n = (await env.notices())[0]
    assert n.state == "unconfirmed"
    diags = await env.hub.alerts.diagnostics()
    assert any(d.get("state") == "unconfirmed" for d in diags)


async def test_token_invalid_refreshes_the_token(env: Env):
    await env.fire("failed")
    env.fake.revoke_tokens()
    await env.hub.alerts.sync_apps()
    await env.round(61)
    assert len(env.fake.sent) == 1


async def test_230013_suspends_delivery_until_recheck(env: Env):
    env.fake.fail("230013", op="send")
    await env.fire("failed")
    await env.round(61)
    assert env.fake.sent == []
    await env.round(600)
    assert env.fake.sent == []                      # suspended: not retried on its own
    diags = await env.hub.alerts.diagnostics()
    assert diags[0]["delivery_state"] == "suspended" and "recheck" in diags[0]["diagnostic"]
    res = await env.hub.alerts.recheck(env.fake.app_id)
    assert res["delivery_state"] == "ok"
    await env.round()
    assert len(env.fake.sent) == 1


async def test_patch_on_a_deleted_card_sends_a_fresh_card(env: Env):
    await env.fire("failed")
    await env.round(61)
    env.fake.fail("230031", op="patch")
    await env.fire("failed")
    await env.round()
    assert len(env.fake.sent) == 2
    inc = (await env.hub.alerts.list_incidents())[0]
    assert inc["card_message_id"] == env.fake.sent[1].message_id


async def test_card_older_than_14_days_is_replaced_by_a_new_message(env: Env):
    await env.fire("failed")
    await env.round(61)
    inc = (await env.hub.alerts.list_incidents())[0]["id"]
    await env.hub.alerts.acknowledge(inc)
    await env.round()
    patches = len(env.fake.patches)
    await env.fire("failed", advance_s=15 * 86400)
    await env.round()
    assert len(env.fake.patches) == patches and len(env.fake.sent) == 2


async def test_missing_admin_keeps_notices_pending_with_a_diagnostic(db_url, tmp_path, clock, fake):
    e = await make_env(db_url, tmp_path, clock, fake, admin=None)
    await e.setup()
    await e.fire("failed")
    await e.round(61)
    await e.round(600)
    assert fake.sent == []
    n = (await e.notices())[0]
    assert n.state == "pending" and "admin_open_id" in n.last_error
    diags = await e.hub.alerts.diagnostics()
    assert diags[0]["delivery_state"] == "unconfigured" and "admin_open_id" in diags[0]["diagnostic"]
    e.hub.settings.feishu.apps[0].admin_open_id = ADMIN             # the operator configures it; the hub restarts
    await e.hub.alerts.sync_apps()
    await e.round(61)
    assert len(fake.sent) == 1 and fake.sent[0].receive_id == ADMIN
    await e.hub.db.close()


async def test_admin_change_retires_old_requests_and_notifies_the_new_admin(env: Env):
    await env.fire("failed")
    await env.round(61)
    inc = (await env.hub.alerts.list_incidents())[0]["id"]
    await env.hub.alerts.acknowledge(inc)
    env.fake.fail("5xx", times=100, op="patch")     # an update to the old admin's card is stuck retrying
    await env.fire("failed")
    await env.round()
    env.fake.clear_faults()
    env.hub.settings.feishu.apps[0].admin_open_id = "ou_new"
    await env.hub.alerts.sync_apps()
    await env.round(61)
    new = env.fake.sent_to("ou_new")
    assert len(new) == 1 and "Failures** 2" in card_text(new[0].content)
    assert "Acknowledged" not in card_text(new[0].content)          # acknowledgement was recipient-specific
    states = {n.state for n in await env.notices()}
    assert "retired" in states
    view = await env.hub.alerts.incident(inc)
    assert view["failures"] == 2 and view["acked_at"] is None and view["card_message_id"] == new[0].message_id
    await env.round(86400)                          # unacknowledged again: the new admin may get a reminder
    assert env.fake.sent_to(ADMIN) and len(env.fake.sent_to(ADMIN)) == 1


async def test_a_lost_publish_is_caught_up_from_the_firings_ledger_exactly_once(env: Env):
    from hub.services.schedules.ports import NullOutcomeSink

    env.hub.schedule_firing.sink = NullOutcomeSink()   # the call after the commit is lost (crash)
    fid = await env.fire("failed")
    await env.round(0)
    await env.round(0)
    decisions = (await env.hub.alerts.explain(fid))["decisions"]
    assert [d["decision"] for d in decisions if d["firing_id"] == fid] == ["aggregated"]
    await env.hub.alerts.publish(await _event(env, fid))               # a late duplicate changes nothing
    await env.round(61)
    assert len(env.fake.sent) == 1


async def _event(env: Env, fid: str):
    from hub.services.schedules.ports import FiringOutcome

    async with env.hub.db.read() as conn:
        f = (await conn.execute(sa.select(firings).where(firings.c.id == fid))).first()
    return FiringOutcome(schedule_id=env.sid, firing_id=fid, nominal_time=f.nominal_time, outcome=f.outcome,
                         admission=f.admission, creator_id=env.alice.principal_id, app_id=None,
                         schedule_type="subtask", one_shot=False)


async def test_explain_tells_why_for_incident_and_firing(env: Env):
    fid = await env.fire("failed")
    await env.round(61)
    inc = (await env.hub.alerts.list_incidents())[0]["id"]
    codes = [d["decision"] for d in (await env.hub.alerts.explain(inc))["decisions"]]
    assert codes[:3] == ["aggregated", "opened", "sent"]
    assert [d["decision"] for d in (await env.hub.alerts.explain(fid))["decisions"]][0] == "aggregated"


async def test_no_creator_binding_and_several_apps_means_no_notice(db_url, tmp_path, clock, fake):
    e = await make_env(db_url, tmp_path, clock, fake)
    # With exactly one application its administrator would be told (test_identity_links); with two, nobody is.
    e.hub.settings.feishu.apps.append(FeishuAppSettings(app_id="cli_second", app_secret="s", admin_open_id="ou_second"))
    await e.setup()
    async with e.hub.db.write() as conn:  # made over MCP/CLI before any identity was linked: nothing frozen
        await conn.execute(identity_bindings.update().values(status="revoked"))
        await conn.execute(schedules.update().values(creator_binding_id=None, app_id=None))
    fid = await e.fire("failed")
    await e.round(61)
    assert fake.sent == [] and await e.notices() == []
    assert (await e.hub.alerts.explain(fid))["decisions"][0]["decision"] == "no_app"
    await e.hub.db.close()


async def test_pause_from_the_alert_center_stops_future_dispatch_only(env: Env):
    await env.fire("failed")
    await env.round(61)
    inc = (await env.hub.alerts.list_incidents())[0]["id"]
    admin = await env.hub.auth.authenticate(await env.hub.auth.create_token("root", admin=True))
    await env.hub.alerts.pause(admin, inc)
    s = await env.hub.schedules.get(admin, env.sid)
    assert s["paused"] is True
    assert (await env.hub.alerts.incident(inc))["state"] == "open"   # execution history untouched
