"""The bot's words over the real doors: signed webhooks and card callbacks
against the fake Feishu Open Platform with the real lark-oapi SDK — the greeting uses the name Feishu's contact
API gives, the Recheck toast and the alert center speak zh-CN from the catalog, Snooze follows `alerts.snooze_s`,
and legacy history reads unconfirmed on the personal history card."""
from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from aiohttp import web

from bot.cards.actions import Alerts, History, Recheck, Snooze
from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.store.db import Database
from hub.ids import new_id
from hub.store.tables import legacy_submissions, runtimes
from tests.fakes.feishu import FakeFeishu, card_buttons, card_text, clock_seconds
from tests.helpers import hub_settings
from tests.integration.test_feishu_bot import ADMIN, EK, VT, Bot, _incident, bot  # noqa: F401 — the fixture

ALLOWED_LATIN = {"amux", "hub", "Asia", "Shanghai", "UTC", "feishu", "apps", "admin_open_id", "ID"}


def english(text: str, *names: str) -> set[str]:
    for n in names:
        text = text.replace(n, "")
    return {w for w in re.findall(r"[A-Za-z_]{3,}", text) if w not in ALLOWED_LATIN}


async def test_the_overview_greets_a_feishu_user_by_the_name_feishu_gives(bot: Bot):
    bot.fake.users["ou_alice"] = "王小丫 Alice"
    card = await bot.overview_card("ou_alice")
    assert "Hello 王小丫 Alice." in card_text(card, "en_us") and "你好，王小丫 Alice" in card_text(card, "zh_cn")
    assert "ou_alice" in bot.fake.contact_lookups           # asked Feishu's contact API through lark-oapi
    card = await bot.overview_card("ou_bob")                   # Feishu gives no name: no open_id in its place
    assert "ou_bob" not in card_text(card, "en_us") and "Hello." in card_text(card, "en_us")


async def test_the_recheck_toast_and_the_alert_center_speak_zh_cn_from_the_catalog(bot: Bot):
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "夜间构建")
    await _incident(bot, sid, alice.principal_id)
    await bot.hub.alerts.sync_apps()
    await bot.overview_card(ADMIN)
    _status, res = await bot.press(ADMIN, Recheck())
    toast = res["toast"]
    assert toast["type"] == "success" and toast["content"].startswith("Delivery rechecked: ok;")
    assert toast["i18n"]["zh_cn"].startswith("已重新检查投递：正常") and not english(toast["i18n"]["zh_cn"])
    center = res["card"]["data"]
    name = f"feishu:{bot.app_id}:ou_alice"
    assert "**投递状态**：正常" in card_text(center, "zh_cn")
    assert not english(card_text(center, "zh_cn"), name, bot.app_id), card_text(center, "zh_cn")


@pytest.fixture
async def bot4h(sqlite_url: str, tmp_path: Path, clock: ManualClock):
    """The `bot` fixture's hub with `alerts.snooze_s = 4 h`."""
    fake = await FakeFeishu(now=clock_seconds(clock)).start()
    settings = hub_settings(sqlite_url, tmp_path)
    settings.alerts.snooze_s = 4 * 3600.0
    settings.feishu.apps = [FeishuAppSettings(app_id=fake.app_id, app_secret=fake.app_secret, encrypt_key=EK,
                                              verification_token=VT, admin_open_id=ADMIN, base_url=fake.base_url)]
    hub = Hub(settings, Database(sqlite_url), clock)
    ops = await hub.auth.authenticate(await hub.auth.create_token("ops", admin=True))
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


async def test_the_snooze_label_and_toast_follow_alerts_snooze_s(bot4h: Bot):
    bot = bot4h
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "nightly build")
    iid = await _incident(bot, sid, alice.principal_id)
    await bot.hub.alerts.sync_apps()
    await bot.overview_card(ADMIN)
    _status, res = await bot.press(ADMIN, Alerts())
    labels = [b["text"]["i18n_content"] for b in card_buttons(res["card"]["data"])]
    assert {"en_us": "Snooze 4 h", "zh_cn": "暂缓 4 小时"} in labels
    assert not any("24" in lab["en_us"] for lab in labels)
    _status, res = await bot.press(ADMIN, Snooze(incident_id=iid, view="inc"))
    assert res["toast"]["content"] == "Snoozed for 4 h" and res["toast"]["i18n"]["zh_cn"] == "已暂缓 4 小时"
    row = await bot.hub.alerts.incident(iid)
    assert row["snoozed_until"].startswith((bot.clock.now() + timedelta(hours=4)).isoformat()[:16])
    card = res["card"]["data"]   # the incident card in place: its time names the schedule's zone
    assert re.search(r"Snoozed until \d{4}-\d\d-\d\d \d\d:\d\d UTC\.", card_text(card)), card_text(card)


async def test_legacy_history_is_unconfirmed_on_the_personal_history_card(bot: Bot):
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "old job")
    async with bot.hub.db.write() as conn:
        await conn.execute(legacy_submissions.insert().values(
            id="leg_1", schedule_id=sid, submitted_at=bot.clock.now() - timedelta(days=3), task_id=None,
            detail={"status": "ok"}))
    h = await bot.hub.schedules.history(alice, sid)
    assert [f["outcome"] for f in h["firings"]] == ["unconfirmed"]          # what REST and MCP say
    _status, res = await bot.press("ou_alice", History(schedule_id=sid))
    card = res["card"]["data"]
    assert "unconfirmed" in card_text(card, "en_us") and "未确认" in card_text(card, "zh_cn")
    assert "unknown" not in card_text(card, "en_us")
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", card_text(card, "en_us"))   # the schedule's zone, named


NASTY = "<at id=all></at> [x](http://evil.example/)"


def _markdown(card: dict) -> list[str]:
    out: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("tag") == "markdown":
                out.extend((node.get("i18n_content") or {}).values())
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(card)
    return out


def _escaped(card: dict, *, in_markdown: bool = True) -> None:
    """The name is escaped wherever markdown renders it; a header is plain text (nothing in it renders)."""
    texts = _markdown(card)
    assert not any("<at id=all>" in t or "[x](" in t for t in texts), texts
    if in_markdown:
        assert any("\\<at id=all\\>" in t for t in texts), texts
    title = card["header"]["title"]
    assert title["tag"] == "plain_text"


async def test_schedule_names_reach_pushed_incident_and_digest_cards_escaped(db_url, tmp_path, clock):
    from hub.services.schedules.service import ScheduleSpec
    from hub.store.tables import task_runs
    from tests.integration.test_alerts_feishu import make_env
    fake = await FakeFeishu(now=clock_seconds(clock)).start()
    try:
        e = await make_env(db_url, tmp_path, clock, fake)
        await e.setup(name=NASTY)
        for i in range(4):   # five failing schedules: three cards, then a digest
            await e.hub.schedules.create(e.alice, ScheduleSpec(prompt="say hi", rule="every 5m", name=f"{NASTY} {i}",
                                                               schedule_type="subtask", timezone="Asia/Shanghai"))
        clock.advance(300)
        await e.hub.schedule_firing.fire_due()
        async with e.hub.db.write() as conn:
            await conn.execute(task_runs.update().values(status="failed"))
        await e.hub.schedule_firing.reconcile()
        await e.round(61)
        assert len(fake.sent) == 3
        for m in fake.sent:
            _escaped(m.content, in_markdown=False)
            assert NASTY in m.content["header"]["title"]["content"]
            assert "Asia/Shanghai" in card_text(m.content)          # "Since" in the schedule's zone, named
        await e.round(1800 + 1)
        digest = fake.sent[-1]
        assert "scheduled task alerts" in card_text(digest.content)
        _escaped(digest.content)
        await e.hub.db.close()
    finally:
        await fake.stop()
