"""Conversation: a chat message becomes a Turn of the chat's Session and the agent's answer is posted back."""
from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import sqlalchemy as sa
from aiohttp import web

from bot.console import ConsoleSink
from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.engines.scripted import ScriptedEngine
from hub.runner.agent import Runner
from hub.store.db import Database
from hub.store.tables import bot_chats, task_runs
from tests.helpers import hub_settings


async def test_a_chat_message_becomes_a_turn_and_the_answer_is_posted_back(sqlite_url: str, tmp_path: Path,
                                                                          clock: ManualClock):
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = [FeishuAppSettings(app_id="cli_chat", verification_token="vt", admin_open_id="ou_boss")]
    hub = Hub(settings, Database(sqlite_url), clock)
    site_runner = web.AppRunner(hub.web_app(background=True), access_log=None)
    await site_runner.setup()
    site = web.TCPSite(site_runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001
    admin = await hub.auth.create_token("admin", admin=True)
    hub.runtimes.hub_url = url
    runner = Runner(url, admin, name="r1", slots=2, workspace_root=tmp_path / "ws", engines={"scripted": ScriptedEngine()})
    task = asyncio.create_task(runner.run_forever())
    try:
        await asyncio.wait_for(runner.registered.wait(), 10)
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
        await runner.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await site_runner.cleanup()
        await hub.db.close()
