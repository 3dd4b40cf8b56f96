"""Migrating creator delivery: when a schedule's notice route moves to another application while its incident
is open, the old application's pending requests are retired, the old card id is never reused, and a fresh card
goes to the new route's administrator (seed: "Changing the administrator or migrating creator delivery retires
old outbox requests and card IDs …")."""
from __future__ import annotations

import sqlalchemy as sa

from hub.app import Hub
from hub.config import FeishuAppSettings
from hub.ids import new_id
from hub.services.schedules.service import ScheduleSpec
from hub.store.db import Database
from hub.store.tables import identity_bindings, incidents, runtimes
from tests.fakes.feishu import FakeFeishu, card_text, clock_seconds
from tests.helpers import hub_settings
from tests.integration.test_alerts_feishu import ADMIN, Env

ADMIN_B = "ou_admin_b"


async def bind(hub: Hub, principal_id: str, app_id: str, open_id: str, now) -> str:
    bid = new_id("ib")
    async with hub.db.write() as conn:
        await conn.execute(identity_bindings.insert().values(id=bid, principal_id=principal_id, app_id=app_id,
                                                             open_id=open_id, status="active", created_at=now))
    return bid


async def test_moving_a_schedules_notice_route_retires_old_requests_and_sends_a_new_card_to_the_new_app(
        db_url, tmp_path, clock):
    fa = await FakeFeishu(now=clock_seconds(clock)).start()
    fb = await FakeFeishu(now=clock_seconds(clock)).start()
    settings = hub_settings(db_url, tmp_path)
    settings.feishu.apps = [
        FeishuAppSettings(app_id=f.app_id, app_secret=f.app_secret, admin_open_id=admin, base_url=f.base_url,
                          timezone="Asia/Shanghai") for f, admin in ((fa, ADMIN), (fb, ADMIN_B))]
    settings.alerts.retry_base_s = 1
    e = Env(Hub(settings, Database(db_url), clock), fa, clock)
    try:
        hub = e.hub
        alice = await hub.auth.authenticate(await hub.auth.create_token("alice"))
        e.alice = alice
        now = clock.now()
        async with hub.db.write() as conn:
            await conn.execute(runtimes.insert().values(
                id=new_id("rt"), name="r1", principal_id=alice.principal_id, shared=True,
                capabilities={"engines": ["scripted"]}, slots=4, status="online", registered_at=now, last_seen_at=now))
        # Made over MCP/CLI before alice linked any identity: its route follows her single linked identity.
        s = await hub.schedules.create(alice, ScheduleSpec(prompt="say hello", rule="every 5m", name="nightly build",
                                                            schedule_type="subtask", timezone="Asia/Shanghai"))
        e.sid = s["schedule_id"]
        assert s["notifications"]["basis"] == "no_app"
        in_a = await bind(hub, alice.principal_id, fa.app_id, "ou_alice_a", now)
        route = (await hub.schedules.get(alice, e.sid))["notifications"]
        assert (route["basis"], route["app_id"]) == ("single_binding", fa.app_id)
        await e.fire("failed")
        await e.round(61)
        assert len(fa.sent) == 1 and fa.sent[0].receive_id == ADMIN
        old_card = fa.sent[0].message_id
        inc = (await hub.alerts.list_incidents())[0]["id"]
        await hub.alerts.acknowledge(inc)               # the old recipient's acknowledgement
        fa.fail("5xx", times=100, op="patch")           # an update of the old card is stuck retrying
        await e.fire("failed")
        await e.round()
        stuck = [n for n in await e.notices() if n.kind == "update" and n.state == "pending"]
        assert len(stuck) == 1

        # alice moves: her identity in A is unlinked, she links in B; the schedule's route now names B.
        async with hub.db.write() as conn:
            await conn.execute(identity_bindings.update().where(identity_bindings.c.id == in_a)
                               .values(status="revoked"))
        await bind(hub, alice.principal_id, fb.app_id, "ou_alice_b", clock.now())
        route = (await hub.schedules.get(alice, e.sid))["notifications"]
        assert (route["basis"], route["app_id"]) == ("single_binding", fb.app_id)
        fa.clear_faults()
        await e.round()

        new = fb.sent_to(ADMIN_B)
        assert len(new) == 1 and "Failures** 2" in card_text(new[0].content) and "nightly build" in card_text(
            new[0].content)
        assert "Acknowledged" not in card_text(new[0].content)         # acknowledgement was the old recipient's
        by_id = {n.id: n for n in await e.notices()}
        assert by_id[stuck[0].id].state == "retired"                   # the old request is retired, never sent
        assert len(fa.sent) == 1 and not [p for p in fa.patches if p[0] == old_card]
        view = await hub.alerts.incident(inc)
        assert view["failures"] == 2 and view["acked_at"] is None and view["card_message_id"] == new[0].message_id
        async with hub.db.read() as conn:
            assert (await conn.execute(sa.select(incidents.c.app_id).where(incidents.c.id == inc))).scalar() \
                == fb.app_id

        await e.fire("failed")                          # a later failure patches the new card, not the old one
        await e.round()
        assert fb.patches and fb.patches[-1][0] == new[0].message_id and "Failures** 3" in card_text(
            fb.patches[-1][1])
        assert not [p for p in fa.patches if p[0] == old_card] and len(fa.sent) == 1
        await e.round(86400)                            # unacknowledged again: reminders go to the new card only
        assert [m.reply_to for m in fb.sent if m.reply_to] == [new[0].message_id]
        assert len(fa.sent) == 1
    finally:
        await e.hub.alerts.aclose()
        await e.hub.db.close()
        await fa.stop()
        await fb.stop()
