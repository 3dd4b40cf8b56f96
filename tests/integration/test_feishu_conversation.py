"""Conversation: a chat message becomes a Turn of the chat's Session on a live progress card, and the card becomes
the agent's answer — every chat output through the outbox."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import sqlalchemy as sa

from bot.console import ConsoleSink
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.store.tables import bot_chats, chat_turns, outbox, task_runs
from tests.helpers import eventually, start_hub


async def test_a_chat_message_becomes_a_turn_whose_card_becomes_the_answer_through_the_outbox(
        sqlite_url: str, tmp_path: Path, clock: ManualClock):
    app = FeishuAppSettings(app_id="cli_chat", verification_token="vt", admin_open_id="ou_boss", profile="scripted")
    handle = await start_hub(sqlite_url, tmp_path, clock, feishu_apps=[app])
    hub = handle.hub
    try:
        await handle.start_runner(slots=2)
        sink = ConsoleSink()
        event = {"sender": {"sender_id": {"open_id": "ou_alice"}, "sender_type": "user"},
                 "message": {"message_id": "om_1", "chat_id": "oc_1", "chat_type": "p2p", "message_type": "text",
                             "content": json.dumps({"text": "say hello from the agent"})}}
        env = {"schema": "2.0", "header": {"event_id": "ev1", "event_type": "im.message.receive_v1"}, "event": event}
        answer, work = await hub.bot.core.accept("cli_chat", env, sink)
        assert answer == {} and work is not None
        await asyncio.wait_for(work, 10)  # returns once the Turn and its card are committed: no waiting for it

        async def done():
            async with hub.db.read() as conn:
                row = (await conn.execute(sa.select(chat_turns))).first()
            return row if row is not None and row.state == "done" else None

        await eventually(done, timeout=40)
        async with hub.db.read() as conn:
            chat = (await conn.execute(sa.select(bot_chats))).one()
            turn = (await conn.execute(sa.select(task_runs).where(task_runs.c.kind == "turn"))).one()
            notices = (await conn.execute(sa.select(outbox).where(outbox.c.turn_id == turn.id)
                                          .order_by(outbox.c.created_at))).all()
        assert turn.session_id == chat.session_id and turn.prompt == "say hello from the agent"
        assert sink.replies == []  # nothing bypasses the outbox
        assert notices[0].kind == "chat_card" and notices[0].payload["reply_to"] == "om_1"
        final = notices[-1]
        assert final.kind == "chat_update" and "hello from the agent" in json.dumps(final.payload["card"])
    finally:
        await handle.stop()
