"""The alert center as an operator drives it: `amux alerts snooze ID --for 4h`, `unsnooze`, `ack --comment`, run
as subprocesses against a live hub, and the incident card showing who acknowledged, when, and the comment."""
from __future__ import annotations

import json
from datetime import datetime, timedelta

from bot.cards.actions import CardAction
from bot.cards.alerts import render
from bot.cards.base import when
from tests.fakes.feishu import card_text
from tests.integration.test_cli_rest import amux
from tests.integration.test_feishu_bot import ADMIN, Bot, _incident, bot  # noqa: F401 (the fixture)


async def _setup(bot: Bot) -> tuple[str, dict]:  # noqa: F811
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "nightly build")
    iid = await _incident(bot, sid, alice.principal_id)
    await bot.hub.alerts.sync_apps()
    token = await bot.hub.auth.create_token("oncall", admin=True)
    return iid, {"AMUX_HUB_URL": bot.url, "AMUX_TOKEN": token}


def _at(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


async def test_snooze_for_a_duration_unsnooze_and_the_default_24_hours(bot: Bot):  # noqa: F811
    iid, env = await _setup(bot)
    now = bot.clock.now()
    code, out, err = await amux("alerts", "snooze", iid, "--for", "4h", "--json", env=env)
    assert code == 0, err
    assert _at(json.loads(out)["snoozed_until"]) == now + timedelta(hours=4)
    code, out, err = await amux("alerts", "snooze", iid, "--for", "1h30m", env=env)
    assert code == 0 and "snoozed until" in out, err
    code, _, err = await amux("alerts", "snooze", iid, "--for", "4 hours", env=env)
    assert code == 2 and "e.g. 30m, 4h, 1d" in err                   # a usage error, nothing sent
    code, out, err = await amux("alerts", "unsnooze", iid, "--json", env=env)
    assert code == 0 and json.loads(out)["snoozed_until"] is None, err
    code, _, err = await amux("alerts", "unsnooze", iid, env=env)
    assert code != 0 and f"amux alerts snooze {iid}" in err           # not snoozed: the refusal names the fix
    code, out, err = await amux("alerts", "snooze", iid, "--json", env=env)
    assert code == 0 and _at(json.loads(out)["snoozed_until"]) == now + timedelta(seconds=86400), err
    code, out, _ = await amux("alerts", "explain", iid, env=env)
    assert "unsnoozed" in out and "snoozed for 4 h" in out


async def test_ack_with_a_comment_is_shown_on_the_card_with_who_and_when(bot: Bot):  # noqa: F811
    iid, env = await _setup(bot)
    code, out, err = await amux("alerts", "ack", iid, "--comment", "disk full on build-3, *cleaning*", "--json",
                                env=env)
    assert code == 0, err
    res = json.loads(out)
    assert res["acked_by"] == "oncall" and res["ack_comment"] == "disk full on build-3, *cleaning*"
    assert _at(res["acked_at"]) == bot.clock.now()
    view = await bot.hub.alerts.card_view(iid)
    card = render(view)
    en, zh = card_text(card), card_text(card, "zh_cn")
    at = when(res["acked_at"], view["timezone"])   # the time in the schedule's zone, named
    assert f"**Acknowledged** by oncall at {at}" in en and at.endswith(view["timezone"])
    assert "**Comment**: disk full on build-3, \\*cleaning\\*" in en  # user text is escaped
    assert "oncall" in zh and "**备注**" in zh and at in zh
    code, out, _ = await amux("alerts", "ack", iid, env=env)
    assert code == 0 and f"acknowledged by oncall at {res['acked_at']}" in out


async def test_a_card_acknowledgement_names_the_feishu_user_and_the_button_keeps_24_hours(bot: Bot):  # noqa: F811
    iid, env = await _setup(bot)
    status, res = await bot.press(ADMIN, CardAction.of("snooze", incident_id=iid, view="inc"))
    assert status == 200
    row = await bot.hub.alerts.incident(iid)
    assert _at(row["snoozed_until"]) == bot.clock.now() + timedelta(hours=24)
    bot.clock.advance(60)
    status, res = await bot.press(ADMIN, CardAction.of("ack", incident_id=iid, view="inc"))
    assert status == 200 and res["toast"]["type"] == "success"
    text = card_text(res["card"]["data"])
    row = await bot.hub.alerts.incident(iid)
    at = when(row["acked_at"], (await bot.hub.alerts.card_view(iid))["timezone"])
    assert f"by <at id={ADMIN}></at> at {at}" in text and "Comment" not in text
    assert f"<at id={ADMIN}></at>" in card_text(res["card"]["data"], "zh_cn")
