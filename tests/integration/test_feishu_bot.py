"""The Feishu bot end to end: signed (and encrypted) webhook requests shaped like Feishu's, the real hub,
real lark-oapi replies to the fake Feishu Open Platform.

Security rules each have a test: forged signature, stale timestamp, duplicate event_id / message_id,
another user's schedule in a card payload, a non-administrator pressing an alert-center button —
each refused with nothing changed.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa
from aiohttp import web

from bot.cards.actions import CardAction
from bot.cards.base import MAX_CARD_BYTES, size_bytes
from bot.feishu.webhook import encrypt, signature
from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.ids import new_id
from hub.services.auth.service import Caller
from hub.services.schedules.service import ScheduleSpec
from hub.store.db import Database
from hub.store.tables import firings, identity_bindings, incidents, runtimes, task_runs
from tests.fakes.feishu import FakeFeishu, Message, card_buttons, card_text, clock_seconds
from tests.helpers import eventually, hub_settings

ADMIN = "ou_admin"
EK, VT = "test-encrypt-key", "test-verification-token"


class Bot:
    """A hub with one webhook-mode Feishu app, and a client that speaks like Feishu."""

    def __init__(self, hub: Hub, fake: FakeFeishu, clock: ManualClock, url: str, runner: web.AppRunner) -> None:
        self.hub, self.fake, self.clock, self.url, self.runner = hub, fake, clock, url, runner
        self.app_id = fake.app_id

    def headers(self, body: bytes, ts: int | None = None, key: str = EK) -> dict:
        ts_s = str(int(self.clock.now().timestamp()) if ts is None else ts)
        nonce = uuid.uuid4().hex
        return {"Content-Type": "application/json", "X-Lark-Request-Timestamp": ts_s, "X-Lark-Request-Nonce": nonce,
                "X-Lark-Signature": signature(ts_s, nonce, key, body)}

    def envelope(self, event_type: str, event: dict, event_id: str | None = None) -> dict:
        return {"schema": "2.0", "header": {
            "event_id": event_id or uuid.uuid4().hex, "token": VT, "event_type": event_type, "tenant_key": "t1",
            "app_id": self.app_id, "create_time": str(int(self.clock.now().timestamp() * 1000))}, "event": event}

    async def post(self, envelope: dict, *, ts: int | None = None, key: str = EK,
                   tamper: bool = False) -> tuple[int, dict]:
        body = json.dumps({"encrypt": encrypt(json.dumps(envelope), EK, os.urandom(16))}).encode()
        headers = self.headers(body, ts, key)
        if tamper:
            body = body.replace(b'"encrypt"', b'"encrypt" ')
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{self.url}/feishu/{self.app_id}/events", data=body, headers=headers) as r:
                return r.status, await r.json(content_type=None)

    async def message(self, open_id: str, text: str, *, message_id: str | None = None, event_id: str | None = None,
                      **kw) -> tuple[int, dict, str]:
        mid = message_id or f"om_{uuid.uuid4().hex[:12]}"
        # The user's message exists on the platform (the fake only knows messages it accepted itself).
        self.fake.messages.setdefault(mid, Message(message_id=mid, receive_id=open_id, uuid=None,
                                                   content={"text": text}, at=self.clock.now().timestamp()))
        event = {"sender": {"sender_id": {"open_id": open_id, "union_id": f"on_{open_id[3:]}", "user_id": None},
                            "sender_type": "user", "tenant_key": "t1"},
                 "message": {"message_id": mid, "root_id": "", "parent_id": "", "chat_id": f"oc_{open_id}",
                             "chat_type": "p2p", "message_type": "text", "content": json.dumps({"text": text}),
                             "create_time": str(int(self.clock.now().timestamp() * 1000)), "mentions": []}}
        status, body = await self.post(self.envelope("im.message.receive_v1", event, event_id), **kw)
        return status, body, mid

    async def press(self, open_id: str, action: CardAction | dict, message_id: str = "om_card",
                    **kw) -> tuple[int, dict]:
        value = action.pack() if isinstance(action, CardAction) else action
        event = {"operator": {"tenant_key": "t1", "open_id": open_id, "union_id": f"on_{open_id[3:]}"},
                 "token": f"c-{uuid.uuid4().hex}", "action": {"value": value, "tag": "button"}, "host": "im_message",
                 "context": {"open_message_id": message_id, "open_chat_id": f"oc_{open_id}"}}
        return await self.post(self.envelope("card.action.trigger", event), **kw)

    async def overview_card(self, open_id: str) -> dict:
        before = len(self.fake.sent)
        status, _, mid = await self.message(open_id, "/amux")
        assert status == 200
        await eventually(lambda: _async(len(self.fake.sent) > before))
        reply = self.fake.sent[-1]
        assert reply.reply_to == mid
        return json.loads(reply.content) if isinstance(reply.content, str) else reply.content

    async def principal(self, open_id: str) -> Caller:
        async with self.hub.db.read() as conn:
            row = (await conn.execute(sa.select(identity_bindings)
                                      .where(identity_bindings.c.open_id == open_id))).first()
        return Caller(row.principal_id, f"feishu:{self.app_id}:{open_id}", "t", "feishu", False)

    async def schedule(self, caller: Caller, name: str, rule: str = "every 1h") -> str:
        s = await self.hub.schedules.create(caller,
                                            ScheduleSpec(prompt=f"say secret prompt of {name}", rule=rule, name=name))
        return s["schedule_id"]


async def _async(v):
    return v


@pytest.fixture
async def bot(sqlite_url: str, tmp_path: Path, clock: ManualClock):
    fake = await FakeFeishu(now=clock_seconds(clock)).start()
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = [FeishuAppSettings(app_id=fake.app_id, app_secret=fake.app_secret, encrypt_key=EK,
                                              verification_token=VT, admin_open_id=ADMIN, base_url=fake.base_url)]
    hub = Hub(settings, Database(sqlite_url), clock)
    token = await hub.auth.create_token("ops", admin=True)
    ops = await hub.auth.authenticate(token)
    async with hub.db.write() as conn:  # a registered runtime, so schedules can be admitted
        now = clock.now()
        await conn.execute(runtimes.insert().values(
            id=new_id("rt"), name="r1", principal_id=ops.principal_id, shared=True,
            capabilities={"engines": ["scripted"]}, slots=4, status="online", registered_at=now, last_seen_at=now))
    runner = web.AppRunner(hub.web_app(background=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield Bot(hub, fake, clock, f"http://127.0.0.1:{port}", runner)
    await runner.cleanup()
    await hub.db.close()
    await fake.stop()


def buttons(card: dict) -> list[dict]:
    """Return the callback values of every button in a card."""
    return [b["behaviors"][0]["value"] for b in card_buttons(card)]


async def test_url_verification_answers_the_challenge(bot: Bot):
    body = json.dumps({"encrypt": encrypt(json.dumps({"type": "url_verification", "challenge": "ch-1", "token": VT}),
                                          EK, os.urandom(16))}).encode()
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{bot.url}/feishu/{bot.app_id}/events", data=body) as r:
            assert r.status == 200 and (await r.json()) == {"challenge": "ch-1"}
        bad = json.dumps({"type": "url_verification", "challenge": "x", "token": "wrong"}).encode()
        async with s.post(f"{bot.url}/feishu/{bot.app_id}/events", data=bad) as r:
            assert r.status == 401


async def test_first_contact_binds_identity_and_amux_replies_with_the_overview(bot: Bot):
    card = await bot.overview_card("ou_alice")
    async with bot.hub.db.read() as conn:
        rows = (await conn.execute(sa.select(identity_bindings).where(identity_bindings.c.open_id == "ou_alice"))).all()
    assert len(rows) == 1 and rows[0].status == "active" and rows[0].union_id == "on_alice"
    assert card["schema"] == "2.0"
    assert "Your schedules" in card_text(card, "en_us") and "你的定时任务" in card_text(card, "zh_cn")
    assert [b["op"] for b in buttons(card)] == ["schedules", "new"]  # no alert center for a non-administrator
    await bot.overview_card("ou_alice")                               # second contact: same binding
    async with bot.hub.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(identity_bindings))).scalar() == 1


async def test_the_alert_center_button_is_shown_only_to_the_administrator(bot: Bot):
    card = await bot.overview_card(ADMIN)
    ops = [b["op"] for b in buttons(card)]
    assert ops == ["schedules", "alerts", "new"]
    rows = [e for e in card["body"]["elements"] if e.get("tag") == "column_set"]
    assert len(rows) == 1 and len(rows[0]["columns"]) == 3            # both entries (and New schedule) share one row


async def test_forged_signature_is_refused_and_nothing_happens(bot: Bot):
    status, _, _ = await bot.message("ou_mallory", "/amux", key="not-the-key")
    assert status == 401
    status, _, _ = await bot.message("ou_mallory", "/amux", tamper=True)
    assert status == 401
    async with bot.hub.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(identity_bindings))).scalar() == 0
    assert bot.fake.sent == []


async def test_replays_are_refused_stale_timestamp_and_duplicate_event_or_message(bot: Bot):
    stale = int((bot.clock.now() - timedelta(minutes=10)).timestamp())
    status, _, _ = await bot.message("ou_alice", "/amux", ts=stale)
    assert status == 401
    assert bot.fake.sent == []
    await bot.overview_card("ou_alice")
    assert len(bot.fake.sent) == 1
    status, body, _ = await bot.message("ou_alice", "/amux", event_id="ev-dup")
    await eventually(lambda: _async(len(bot.fake.sent) == 2))
    status, body, _ = await bot.message("ou_alice", "/amux", event_id="ev-dup")   # Feishu redelivers: same event id
    assert status == 200 and body == {}
    mid = "om_same_message"
    await bot.message("ou_alice", "/amux", message_id=mid)
    await eventually(lambda: _async(len(bot.fake.sent) == 3))
    await bot.message("ou_alice", "/amux", message_id=mid)                         # new event id, same message
    await bot.hub.bot.core.aclose()
    assert len(bot.fake.sent) == 3


async def test_overview_summary_counts_and_latest_outcomes(bot: Bot):
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    a = await bot.schedule(alice, "nightly build")
    b = await bot.schedule(alice, "weekly report")
    await bot.hub.schedules.pause(alice, b)
    now = bot.clock.now()
    async with bot.hub.db.write() as conn:
        await conn.execute(firings.insert().values(id=new_id("fir"), schedule_id=a, nominal_time=now, fired_at=now,
                                                   admission="ok", outcome="failed", missed_count=0, legacy=False))
    card = await bot.overview_card("ou_alice")
    text = card_text(card)
    assert "**Your schedules**: 2 · **failing**: 1 · **paused**: 1" in text
    assert "nightly build" in text and "failed" in text
    assert "失败" in card_text(card, "zh_cn")


async def test_personal_schedules_are_paginated_and_only_the_viewers_own(bot: Bot):
    await bot.overview_card("ou_alice")
    await bot.overview_card("ou_bob")
    alice, bob = await bot.principal("ou_alice"), await bot.principal("ou_bob")
    for i in range(7):
        await bot.schedule(alice, f"alice job {i}")
        bot.clock.advance(1)
    await bot.schedule(bob, "bob secret job")
    status, res = await bot.press("ou_alice", CardAction.of("schedules"))
    assert status == 200
    page1 = res["card"]["data"]
    opened = [b for b in buttons(page1) if b["op"] == "detail"]
    assert len(opened) == 5 and "bob secret job" not in card_text(page1)
    assert {"p": "amux", "v": 1, "op": "schedules", "pg": 1} in buttons(page1)
    status, res = await bot.press("ou_alice", CardAction.of("schedules", page=1))
    page2 = res["card"]["data"]
    assert len([b for b in buttons(page2) if b["op"] == "detail"]) == 2
    assert "Page 2 of 2 · 7 schedules" in card_text(page2)


async def test_a_card_action_naming_another_users_schedule_is_refused(bot: Bot):
    await bot.overview_card("ou_alice")
    await bot.overview_card("ou_bob")
    bob = await bot.principal("ou_bob")
    sid = await bot.schedule(bob, "bob secret job")
    for op in ("detail", "history", "results", "pause", "delete"):
        status, res = await bot.press("ou_alice", CardAction.of(op, schedule_id=sid))
        assert status == 200 and res["toast"]["type"] == "error" and "card" not in res, op
        assert "不是你的" in res["toast"]["i18n"]["zh_cn"]
    got = await bot.hub.schedules.get(bob, sid)
    assert got["paused"] is False
    status, res = await bot.press("ou_alice", {"p": "amux", "v": 99, "op": "pause", "s": sid})
    assert res["toast"]["type"] == "warning"


async def test_pause_resume_delete_are_idempotent_and_back_refreshes_the_overview(bot: Bot):
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "nightly build")
    for _ in range(2):
        status, res = await bot.press("ou_alice", CardAction.of("pause", schedule_id=sid))
        assert res["toast"]["type"] == "success"
        assert (await bot.hub.schedules.get(alice, sid))["paused"] is True
        assert {"p": "amux", "v": 1, "op": "resume", "s": sid} in buttons(res["card"]["data"])
    status, res = await bot.press("ou_alice", CardAction.of("overview"))
    assert "**paused**: 1" in card_text(res["card"]["data"])
    for _ in range(2):
        status, res = await bot.press("ou_alice", CardAction.of("resume", schedule_id=sid))
        assert (await bot.hub.schedules.get(alice, sid))["paused"] is False
    for _ in range(2):
        status, res = await bot.press("ou_alice", CardAction.of("delete", schedule_id=sid))
        assert res["toast"]["type"] == "success" and "deleted" in card_text(res["card"]["data"])
    status, res = await bot.press("ou_alice", CardAction.of("overview"))
    assert "**Your schedules**: 0" in card_text(res["card"]["data"])


async def _incident(bot: Bot, sid: str, creator_id: str) -> str:
    iid = new_id("inc")
    now = bot.clock.now()
    async with bot.hub.db.write() as conn:
        await conn.execute(incidents.insert().values(
            id=iid, schedule_id=sid, app_id=bot.app_id, creator_id=creator_id, kind="failure", state="open",
            active_key=sid, failures=2, missed=0, unknowns=0, last_outcome="failed", opened_at=now, updated_at=now))
    return iid


async def test_alert_center_is_admin_only_shows_names_not_prompts_and_acknowledges(bot: Bot):
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "nightly build")
    iid = await _incident(bot, sid, alice.principal_id)
    await bot.hub.alerts.sync_apps()
    for action in (CardAction.of("alerts"), CardAction.of("ack", incident_id=iid),
                   CardAction.of("snooze", incident_id=iid), CardAction.of("recheck")):
        status, res = await bot.press("ou_alice", action)
        assert res["toast"]["type"] == "error" and "card" not in res
        assert "管理员" in res["toast"]["i18n"]["zh_cn"]
    async with bot.hub.db.read() as conn:
        row = (await conn.execute(sa.select(incidents).where(incidents.c.id == iid))).first()
    assert row.acked_at is None and row.snoozed_until is None
    await bot.overview_card(ADMIN)
    status, res = await bot.press(ADMIN, CardAction.of("alerts"))
    center = card_text(res["card"]["data"])
    assert "nightly build" in center and f"feishu:{bot.app_id}:ou_alice" in center
    assert "secret prompt" not in center                      # never the creator's prompt
    assert not any(b["op"] in ("pause", "resume", "delete", "results", "detail") for b in buttons(res["card"]["data"]))
    status, res = await bot.press(ADMIN, CardAction.of("ack", incident_id=iid))
    assert res["toast"]["type"] == "success"
    async with bot.hub.db.read() as conn:
        row = (await conn.execute(sa.select(incidents).where(incidents.c.id == iid))).first()
    assert row.acked_at is not None
    status, res = await bot.press(ADMIN, CardAction.of("overview"))
    assert [b["op"] for b in buttons(res["card"]["data"])] == ["schedules", "alerts", "new"]


async def test_results_are_split_across_parts_under_30kb_and_history_pages(bot: Bot):
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "big report")
    text = ("结果 line with *stars* and <at id=all></at>\n" * 2000)
    now = bot.clock.now()
    async with bot.hub.db.write() as conn:
        for i in range(12):
            tid = new_id("tr")
            await conn.execute(task_runs.insert().values(
                id=tid, owner_id=alice.principal_id, prompt="x", snapshot={}, status="succeeded", outcome="succeeded",
                result_text=text if i == 11 else f"short {i}", attempt=0, event_seq=0, last_rseq=0, created_at=now,
                kind="task"))
            await conn.execute(firings.insert().values(
                id=new_id("fir"), schedule_id=sid, nominal_time=now + timedelta(hours=i), fired_at=now,
                admission="ok", task_id=tid, outcome="succeeded", missed_count=0, legacy=False))
    status, res = await bot.press("ou_alice", CardAction.of("results", schedule_id=sid))
    card = res["card"]["data"]
    parts = int(card_text(card).split("Part 1 of ")[1].split()[0])
    assert parts > 1
    seen = []
    for part in range(parts):
        status, res = await bot.press("ou_alice", CardAction.of("results", schedule_id=sid, sub=part))
        card = res["card"]["data"]
        assert size_bytes(card) <= MAX_CARD_BYTES
        seen.append(next(e["content"] for e in card["body"]["elements"]
                         if e.get("tag") == "markdown" and "i18n_content" not in e))
    joined = "".join(seen)
    assert re.search(r"(?<!\\)<at", joined) is None and "\\<at id=all\\>" in joined   # no mention sneaks in
    assert joined.replace("\\", "") == text.replace("\\", "")                             # nothing lost across parts
    status, res = await bot.press("ou_alice", CardAction.of("history", schedule_id=sid))
    assert {"p": "amux", "v": 1, "op": "history", "s": sid, "pg": 1} in buttons(res["card"]["data"])
    status, res = await bot.press("ou_alice", CardAction.of("history", schedule_id=sid, page=1))
    assert "Page 2" in card_text(res["card"]["data"])
