"""`/amux help` over a signed webhook: what the bot understands, in English and Simplified Chinese; a command it
does not know is named, and answered with the same help (not the overview)."""
from __future__ import annotations

import json

import sqlalchemy as sa

from hub.store.tables import sessions
from tests.fakes.feishu import card_buttons, card_text
from tests.integration.test_feishu_bot import Bot, bot  # noqa: F401 — the bot fixture, reused
from tests.integration.test_feishu_login_link import reply_to

COMMANDS = ("/amux login", "/amux link CODE", "/amux help")


async def help_reply(b: Bot, text: str) -> dict:
    status, _, mid = await b.message("ou_alice", text)
    assert status == 200
    reply = await reply_to(b, mid)
    card = json.loads(reply.content) if isinstance(reply.content, str) else reply.content
    assert card["schema"] == "2.0"
    return card


async def test_amux_help_lists_every_command_in_english_and_chinese(bot: Bot):  # noqa: F811
    card = await help_reply(bot, "/amux help")
    en, zh = card_text(card, "en_us"), card_text(card, "zh_cn")
    assert "What amux understands" in en and "amux 能理解的内容" in zh
    for command in COMMANDS:
        assert command in en and command in zh
    assert "next turn of this chat's session" in en and "作为本会话的下一轮发送给智能体" in zh
    assert "does not know" not in en and "Your schedules" not in en  # help, not the overview
    assert [b["behaviors"][0]["value"]["op"] for b in card_buttons(card)] == ["overview"]


async def test_an_unknown_command_says_so_and_shows_the_help_not_the_overview(bot: Bot):  # noqa: F811
    card = await help_reply(bot, "/amux nonsense please")
    en, zh = card_text(card, "en_us"), card_text(card, "zh_cn")
    assert "amux does not know the command **nonsense**." in en and "amux 不认识命令 **nonsense**。" in zh
    assert "What amux understands" in en and all(c in en for c in COMMANDS)
    assert "Your schedules" not in en
    async with bot.hub.db.read() as conn:  # nothing went to the agent
        assert (await conn.execute(sa.select(sa.func.count()).select_from(sessions))).scalar() == 0


async def test_an_unknown_command_word_is_escaped_in_the_help(bot: Bot):  # noqa: F811
    card = await help_reply(bot, "/amux [x](http://evil)")
    assert "[x](http://evil)" not in card_text(card, "en_us")
