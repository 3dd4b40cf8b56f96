"""Task notification preferences: the creator chooses per schedule `notify = failures | all | none`.

Through the alert pipeline to the fake Feishu (lark-oapi), the personal card's toggle (signed webhook), the CLI
and MCP field; an administrator change keeps the choice.
"""
from __future__ import annotations

import sqlalchemy as sa

from bot.cards.actions import CardAction
from hub.config import FeishuAppSettings
from hub.errors import Invalid
from hub.services.schedules.service import ScheduleSpec
from hub.store.tables import schedules
from tests.fakes.feishu import card_text
from tests.integration.test_alerts_feishu import fake, make_env  # noqa: F401 — fixture
from tests.integration.test_feishu_bot import Bot, bot, buttons  # noqa: F401 — fixture
from tests.integration.test_identity_links import amux
from tests.helpers import mcp_client


async def _notify(env, mode: str) -> None:
    await env.hub.schedules.update(env.alice, env.sid, ScheduleSpec(notify=mode))


async def test_notify_defaults_to_failures_and_recurring_success_stays_quiet(db_url, tmp_path, clock, fake):
    env = await make_env(db_url, tmp_path, clock, fake)
    await env.setup()
    assert (await env.hub.schedules.get(env.alice, env.sid))["notify"] == "failures"
    await env.fire("succeeded")
    await env.round(61)
    assert fake.sent == []
    await env.fire("failed")
    await env.round(61)
    assert len(fake.sent) == 1
    await env.hub.db.close()


async def test_notify_all_sends_a_receipt_for_every_run(db_url, tmp_path, clock, fake):
    env = await make_env(db_url, tmp_path, clock, fake, quiet_hours="")
    await env.setup()
    await _notify(env, "all")
    await env.fire("succeeded")
    await env.round()
    assert len(fake.sent) == 1 and "succeeded" in card_text(fake.sent[0].content)
    assert "alice" in card_text(fake.sent[0].content)                   # creator attribution
    await env.fire("succeeded")
    await env.round()
    assert len(fake.sent) == 2
    await env.hub.db.close()


async def test_notify_none_mutes_the_schedules_notices_and_says_why(db_url, tmp_path, clock, fake):
    env = await make_env(db_url, tmp_path, clock, fake)
    await env.setup()
    await _notify(env, "none")
    fid = await env.fire("failed")
    await env.round(61)
    await env.round(86400)
    assert fake.sent == [] and await env.notices() == []
    assert (await env.hub.alerts.explain(fid))["decisions"][0]["decision"] == "muted"
    await env.hub.db.close()


async def test_an_unknown_notify_value_is_refused_naming_the_choices(db_url, tmp_path, clock, fake):
    env = await make_env(db_url, tmp_path, clock, fake)
    await env.setup()
    try:
        await _notify(env, "sometimes")
    except Invalid as e:
        assert '"failures"' in e.message and '"none"' in e.message
    else:
        raise AssertionError("notify=sometimes was accepted")
    await env.hub.db.close()


async def test_administrator_change_preserves_the_notification_preference(db_url, tmp_path, clock, fake):
    env = await make_env(db_url, tmp_path, clock, fake)
    await env.setup()
    await _notify(env, "none")
    await env.round()
    env.hub.settings.feishu.apps[0] = FeishuAppSettings(app_id=fake.app_id, app_secret=fake.app_secret,
                                                        admin_open_id="ou_new_admin", base_url=fake.base_url)
    env.hub.alerts.feishu.apps[0] = env.hub.settings.feishu.apps[0]
    await env.hub.alerts.sync_apps()
    assert (await env.hub.schedules.get(env.alice, env.sid))["notify"] == "none"
    await env.fire("failed")
    await env.round(61)
    assert fake.sent == []
    await env.hub.db.close()


async def test_the_creator_toggles_notify_from_the_personal_card(bot: Bot):
    await bot.overview_card("ou_alice")                     # first contact binds alice
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "nightly")
    status, res = await bot.press("ou_alice", CardAction.of("detail", schedule_id=sid))
    card = res["card"]["data"]
    assert "**Notifications**: failures only" in card_text(card)
    toggles = [b for b in buttons(card) if b["op"] == "notify"]
    assert len(toggles) == 2
    status, res = await bot.press("ou_alice", next(t for t in toggles if t.get("sub") == 2))   # off
    assert status == 200 and res["toast"]["content"] == "Notifications updated"
    assert "**Notifications**: off" in card_text(res["card"]["data"])
    assert "通知" in card_text(res["card"]["data"], "zh_cn")
    async with bot.hub.db.read() as conn:
        assert (await conn.execute(sa.select(schedules.c.notify).where(schedules.c.id == sid))).scalar() == "none"
    status, res = await bot.press("ou_mallory", CardAction.of("notify", schedule_id=sid, sub=1))   # not hers: refused
    assert res["toast"]["type"] == "error"
    async with bot.hub.db.read() as conn:
        assert (await conn.execute(sa.select(schedules.c.notify).where(schedules.c.id == sid))).scalar() == "none"


async def test_cli_and_mcp_set_the_notify_field(bot: Bot):
    token = await bot.hub.auth.create_token("carol")
    code, s, err = await amux(bot, token, "schedule", "create", "--type", "subtask", "--rule", "every 1h",
                              "--prompt", "say hi", "--notify", "all", "--json")
    assert code == 0 and s["notify"] == "all", err
    code, out, err = await amux(bot, token, "schedule", "notify", s["schedule_id"], "none")
    assert code == 0 and "notify none" in out, err
    async with mcp_client(bot.url, token) as client:
        res = await client.call_tool("schedule_update", {"schedule_id": s["schedule_id"], "notify": "failures"})
        assert not res.is_error, res
        assert res.structured_content["notify"] == "failures"
