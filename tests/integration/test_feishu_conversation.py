"""Conversation: a chat message becomes a Turn of the chat's Session and the agent's answer is posted back."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import sqlalchemy as sa

from bot.console import ConsoleSink
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.store.tables import bot_chats, task_runs
from tests.helpers import start_hub


async def test_a_chat_message_becomes_a_turn_and_the_answer_is_posted_back(sqlite_url: str, tmp_path: Path,
                                                                          clock: ManualClock):
    app = FeishuAppSettings(app_id="cli_chat", verification_token="vt", admin_open_id="ou_boss")
    handle = await start_hub(sqlite_url, tmp_path, clock, feishu_apps=[app])
    hub = handle.hub
    try:
        await handle.start_runner(slots=2)
        sink = ConsoleSink()
        event = {"sender": {"sender_id": {"open_id": "ou_alice"}, "sender_type": "user"},
                 "message": {"message_id": "om_1", "chat_id": "oc_1", "chat_type": "p2p", "message_type": "text",
                             "content": json.dumps({"text": "say hello from the agent"})}}
        env = {"schema": "2.0", "header": {"event_id": "ev1", "event_type": "im.message.receive_v1"}, "event": event}
        hub.bot.core.turn_wait_s = 30
        answer, work = await hub.bot.core.accept("cli_chat", env, sink)
        assert answer == {} and work is not None
        await asyncio.wait_for(work, 40)
        assert sink.replies[0]["msg_type"] == "text" and "hello from the agent" in sink.replies[0]["content"]["text"]
        async with hub.db.read() as conn:
            chat = (await conn.execute(sa.select(bot_chats))).one()
            turn = (await conn.execute(sa.select(task_runs).where(task_runs.c.kind == "turn"))).one()
        assert turn.session_id == chat.session_id and turn.prompt == "say hello from the agent"
    finally:
        await handle.stop()
