"""`/amux login` in a private chat: the bot sends a one-time link that signs the user in on the hub's OAuth
approval page, so a hosted MCP client is approved without pasting a token."""
from __future__ import annotations

import json
import re
import uuid

import httpx2

from tests.fakes.feishu import Message, card_text
from tests.helpers import eventually
from tests.integration.test_feishu_bot import Bot, bot  # noqa: F401 — the bot fixture, reused

async def reply_to(b: Bot, mid: str) -> Message:
    async def found() -> Message | None:
        return next((m for m in b.fake.sent if m.reply_to == mid), None)

    return await eventually(found)


LINK = re.compile(r"\((http://[^)]+/oauth/login\?code=[^)]+)\)")


async def group_message(b: Bot, open_id: str, text: str) -> str:
    mid = f"om_{uuid.uuid4().hex[:12]}"
    b.fake.messages.setdefault(mid, Message(message_id=mid, receive_id=open_id, uuid=None, content={"text": text},
                                            at=b.clock.now().timestamp()))
    event = {"sender": {"sender_id": {"open_id": open_id}, "sender_type": "user", "tenant_key": "t1"},
             "message": {"message_id": mid, "chat_id": "oc_team", "chat_type": "group", "message_type": "text",
                         "content": json.dumps({"text": text}), "mentions": [],
                         "create_time": str(int(b.clock.now().timestamp() * 1000))}}
    status, _ = await b.post(b.envelope("im.message.receive_v1", event))
    assert status == 200
    return mid


async def test_amux_login_in_a_private_chat_sends_a_one_time_link_that_signs_in_the_approval_page(bot: Bot):
    bot.hub.runner_dispatch.hub_url = bot.url
    status, _, mid = await bot.message("ou_alice", "/amux login")
    assert status == 200
    reply = await reply_to(bot, mid)
    card = reply.content
    text_en, text_zh = card_text(card, "en_us"), card_text(card, "zh_cn")
    assert "Sign in as" in text_en and "登录" in text_zh
    link = LINK.search(text_en).group(1)
    code = link.split("code=", 1)[1]
    async with httpx2.AsyncClient(timeout=10) as browser:
        page = await browser.get(link)  # a link preview does not spend it
        assert page.status_code == 200
        login = await browser.post(f"{bot.url}/oauth/login", data={"code": code})
        assert login.status_code == 200 and "Signed in as <b>" in login.text  # (no approval was pending)
        assert browser.cookies  # the browser session the approval page will recognise
        again = await browser.post(f"{bot.url}/oauth/login", data={"code": code})
        assert again.status_code >= 400  # one use


async def test_amux_login_in_a_group_chat_sends_no_link(bot: Bot):
    await bot.message("ou_alice", "/amux")  # first contact binds the identity
    mid = await group_message(bot, "ou_alice", "/amux login")
    reply = await reply_to(bot, mid)
    text = card_text(reply.content, "en_us")
    assert "private chat" in text and "oauth/login" not in json.dumps(reply.content)
