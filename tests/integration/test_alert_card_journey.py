"""The administrator acts from the card that reached them, over real HTTP.

A failing schedule → the incident card reaches the fake Feishu through lark-oapi → a signed, encrypted
`card.action.trigger` built from THAT card's own button values → the hub answers with the card refreshed in
place; reminders stop (Acknowledge), hold for 24 h and then come back (Snooze, under the injected clock), or a
suspension clears (Recheck). Anyone but the application's administrator is refused with nothing changed.
"""
from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa
from aiohttp import web

from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.ids import new_id
from hub.services.schedules.service import ScheduleSpec
from hub.store.db import Database
from hub.store.tables import firings, identity_bindings, incidents, runtimes, schedules, task_runs
from tests.fakes.feishu import FakeFeishu, card_buttons, card_text, clock_seconds, signed_card_callback
from tests.helpers import hub_settings

ADMIN, ALICE = "ou_admin", "ou_alice"
EK, VT = "journey-encrypt-key", "journey-verification-token"


class Journey:
    """A hub with one webhook-mode app on a real port, alice's failing schedule, and a Feishu-shaped client."""

    def __init__(self, hub: Hub, fake: FakeFeishu, clock: ManualClock, url: str) -> None:
        self.hub, self.fake, self.clock, self.url = hub, fake, clock, url

    async def setup(self) -> "Journey":
        alice = await self.hub.auth.authenticate(await self.hub.auth.create_token("alice"))
        now = self.clock.now()
        async with self.hub.db.write() as conn:
            await conn.execute(identity_bindings.insert().values(
                id=new_id("ib"), principal_id=alice.principal_id, app_id=self.fake.app_id, open_id=ALICE,
                status="active", created_at=now))
            await conn.execute(runtimes.insert().values(
                id=new_id("rt"), name="r1", principal_id=alice.principal_id, shared=True,
                capabilities={"engines": ["scripted"]}, slots=4, status="online", registered_at=now, last_seen_at=now))
        s = await self.hub.schedules.create(alice, ScheduleSpec(prompt="say hi", rule="every 5m", name="nightly build",
                                                                 schedule_type="subtask", timezone="UTC"))
        self.sid = s["schedule_id"]
        return self

    async def fail_once(self) -> None:
        self.clock.advance(300)
        async with self.hub.db.write() as conn:
            await conn.execute(schedules.update().where(schedules.c.id == self.sid)
                               .values(next_fire_at=self.clock.now()))
        await self.hub.schedule_firing.fire_due()
        async with self.hub.db.write() as conn:
            row = (await conn.execute(sa.select(firings).where(firings.c.schedule_id == self.sid)
                                      .order_by(firings.c.nominal_time.desc()).limit(1))).first()
            await conn.execute(task_runs.update().where(task_runs.c.id == row.task_id).values(status="failed"))
        await self.hub.schedule_firing.reconcile()

    async def round(self, advance_s: float = 0) -> None:
        self.clock.advance(advance_s)
        await self.hub.alerts.tick()

    async def press(self, open_id: str, value: dict, message_id: str) -> dict:
        """POST a signed, encrypted card callback the way Feishu builds it; return the JSON answer."""
        body, headers = signed_card_callback(app_id=self.fake.app_id, open_id=open_id, value=value,
                                             message_id=message_id, now_s=self.clock.now().timestamp(), token=VT,
                                             encrypt_key=EK)
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{self.url}/feishu/{self.fake.app_id}/events", data=body, headers=headers) as r:
                assert r.status == 200
                return await r.json(content_type=None)

    async def incident(self):
        async with self.hub.db.read() as conn:
            return (await conn.execute(sa.select(incidents))).first()

    def reminders(self, card_id: str) -> list:
        return [m for m in self.fake.sent if m.reply_to == card_id]


def button(card: dict, label: str) -> dict:
    """Return the callback value of the card's button labelled `label` (English)."""
    found = [b["behaviors"][0]["value"] for b in card_buttons(card) if b["text"]["content"] == label]
    assert len(found) == 1, f"no single {label!r} button in {card_text(card)}"
    return found[0]


def labels(card: dict) -> list[str]:
    out: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if node.get("tag") == "button":
                out.append(node["text"]["content"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(card)
    return out


@pytest.fixture
async def journey(sqlite_url: str, tmp_path: Path, clock: ManualClock):
    fake = await FakeFeishu(now=clock_seconds(clock)).start()
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = [FeishuAppSettings(app_id=fake.app_id, app_secret=fake.app_secret, encrypt_key=EK,
                                              verification_token=VT, admin_open_id=ADMIN, base_url=fake.base_url,
                                              timezone="UTC")]
    settings.alerts.quiet_hours = ""
    hub = Hub(settings, Database(sqlite_url), clock)
    runner = web.AppRunner(hub.web_app(background=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    j = await Journey(hub, fake, clock, f"http://127.0.0.1:{runner.addresses[0][1]}").setup()
    await j.fail_once()
    await j.round(61)
    assert len(fake.sent) == 1 and fake.sent[0].receive_id == ADMIN
    yield j
    await runner.cleanup()
    await hub.db.close()
    await fake.stop()


def _card(j: Journey) -> tuple[str, dict]:
    m = j.fake.sent[0]
    return m.message_id, (json.loads(m.content) if isinstance(m.content, str) else m.content)


async def test_pushed_card_has_acknowledge_snooze_recheck_and_no_execution_control(journey: Journey):
    _mid, card = _card(journey)
    assert labels(card) == ["Acknowledge", "Snooze 24 h", "Recheck"]
    assert "Pause" not in json.dumps(card)


async def test_acknowledge_from_the_pushed_card_stops_reminders_and_refreshes_it_in_place(journey: Journey):
    mid, card = _card(journey)
    res = await journey.press(ADMIN, button(card, "Acknowledge"), mid)
    assert res["toast"]["content"] == "Acknowledged"
    refreshed = res["card"]["data"]
    text = card_text(refreshed)
    assert f"**Acknowledged** by <at id={ADMIN}></at> at " in text and "no more reminders." in text  # who and when
    assert "nightly build" in text
    assert labels(refreshed) == ["Recheck"]
    assert (await journey.incident()).acked_by == ADMIN
    await journey.round(3 * 86400)
    assert journey.reminders(mid) == []


async def test_snooze_from_the_pushed_card_holds_reminders_24h_then_they_resume(journey: Journey):
    mid, card = _card(journey)
    journey.clock.advance(3600)
    res = await journey.press(ADMIN, button(card, "Snooze 24 h"), mid)
    assert res["toast"]["content"] == "Snoozed for 24 h" and "Snoozed until" in card_text(res["card"]["data"])
    await journey.round(86400 - 3600 + 600)       # a day after the card: the usual reminder time, still snoozed
    assert journey.reminders(mid) == []
    await journey.round(3600 - 600 - 60)           # 1 minute before the snooze ends
    assert journey.reminders(mid) == []
    await journey.round(120)                       # the snooze ended: the reminder comes
    assert len(journey.reminders(mid)) == 1


async def test_recheck_from_the_pushed_card_clears_a_suspension(journey: Journey):
    mid, card = _card(journey)
    journey.fake.fail("230013", op="reply")        # the reminder is refused: delivery of this app is suspended
    await journey.round(86400)
    assert journey.reminders(mid) == []
    assert (await journey.hub.alerts.diagnostics())[0]["delivery_state"] == "suspended"
    await journey.round(3600)
    assert journey.reminders(mid) == []            # suspended: not retried on its own
    res = await journey.press(ADMIN, button(card, "Recheck"), mid)
    assert res["toast"]["content"].startswith("Delivery rechecked: ok;")
    assert "nightly build" in card_text(res["card"]["data"])
    assert await journey.hub.alerts.diagnostics() == []
    await journey.round()
    assert len(journey.reminders(mid)) == 1


async def test_card_buttons_are_refused_for_anyone_but_the_administrator(journey: Journey):
    mid, card = _card(journey)
    for label in ("Acknowledge", "Snooze 24 h", "Recheck"):
        res = await journey.press(ALICE, button(card, label), mid)   # the creator, bound to this app
        assert res["toast"]["type"] == "error" and "administrator" in res["toast"]["content"] and "card" not in res
        res = await journey.press("ou_stranger", button(card, label), mid)
        assert res["toast"]["type"] == "error" and "card" not in res
    inc = await journey.incident()
    assert inc.acked_at is None and inc.snoozed_until is None
    await journey.round(86400)
    assert len(journey.reminders(mid)) == 1        # nothing changed: the daily reminder still comes


async def test_a_card_retired_by_an_administrator_change_answers_the_fix_and_changes_nothing(journey: Journey):
    mid, card = _card(journey)
    app = journey.hub.settings.feishu.apps[0]
    journey.hub.settings.feishu.apps[0] = app.model_copy(update={"admin_open_id": "ou_new_admin"})
    journey.hub.alerts.feishu.apps[0] = journey.hub.settings.feishu.apps[0]
    journey.hub.bot.core.apps[app.app_id] = journey.hub.settings.feishu.apps[0]
    await journey.hub.alerts.sync_apps()                    # as at a restart: old requests retired, card ids forgotten
    await journey.round()                                   # a fresh card for the new administrator
    res = await journey.press(ADMIN, button(card, "Acknowledge"), mid)
    assert res["toast"]["type"] == "error" and "administrator changed" in res["toast"]["content"] and "card" not in res
    assert "管理员" in res["toast"]["i18n"]["zh_cn"]
    assert (await journey.incident()).acked_at is None
    fresh = [m for m in journey.fake.sent if m.receive_id == "ou_new_admin"]
    assert len(fresh) == 1
    new_card = json.loads(fresh[0].content) if isinstance(fresh[0].content, str) else fresh[0].content
    res = await journey.press("ou_new_admin", button(new_card, "Acknowledge"), fresh[0].message_id)
    assert res["toast"]["content"] == "Acknowledged" and (await journey.incident()).acked_by == "ou_new_admin"
