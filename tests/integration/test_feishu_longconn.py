"""Long-connection mode: one hub replica at a time holds an application's connection (a lease row)."""
from __future__ import annotations

from pathlib import Path

from bot.core import FeishuBot
from bot.feishu.longconn import LongConnections
from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.store.db import Database
from tests.helpers import hub_settings


async def test_only_one_replica_holds_the_long_connection_and_another_takes_over_after_expiry(
        db_url: str, tmp_path: Path, clock: ManualClock):
    settings = hub_settings(db_url, tmp_path)
    settings.feishu.apps = [FeishuAppSettings(app_id="cli_ws", app_secret="s", mode="long-connection")]
    hubs = [Hub(settings, Database(db_url), clock) for _ in range(2)]
    started: list[str] = []
    conns = [LongConnections(FeishuBot(h), h, lease_s=30, holder=f"r{i}", starter=lambda app, loop, i=i: started.append(f"r{i}"))
             for i, h in enumerate(hubs)]
    try:
        assert await conns[0].claim("cli_ws") is True
        assert await conns[1].claim("cli_ws") is False
        clock.advance(20)
        assert await conns[0].claim("cli_ws") is True              # renewal by the holder
        clock.advance(20)
        assert await conns[1].claim("cli_ws") is False             # still held (renewed 20 s ago)
        clock.advance(31)                                          # the holder went quiet: the lease expired
        assert await conns[1].claim("cli_ws") is True
        assert await conns[0].claim("cli_ws") is False
        assert started == []
        conns[1].start()                                           # the keeper of the holder starts the client once
        conns[0].start()
        import asyncio
        for _ in range(50):
            if started:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        assert started == ["r1"]
        await conns[0].stop()
        await conns[1].stop()
    finally:
        for h in hubs:
            await h.db.close()


async def test_an_event_frame_on_the_long_connection_reaches_the_bot_through_the_sdk_dispatcher(
        sqlite_url: str, tmp_path: Path, clock: ManualClock):
    import asyncio
    import json

    from bot.console import ConsoleSink

    settings = hub_settings(sqlite_url, tmp_path)
    app = FeishuAppSettings(app_id="cli_wsev", app_secret="s", mode="long-connection", admin_open_id="ou_boss")
    settings.feishu.apps = [app]
    hub = Hub(settings, Database(sqlite_url), clock)
    sink = ConsoleSink()
    bot = FeishuBot(hub, messenger=sink)
    conns = LongConnections(bot, hub, holder="r0", starter=lambda app, loop: None)
    try:
        handler = conns.event_handler(app, asyncio.get_running_loop())
        frame = {"schema": "2.0",
                 "header": {"event_id": "ev_ws_1", "event_type": "im.message.receive_v1", "app_id": "cli_wsev",
                            "create_time": str(int(clock.now().timestamp() * 1000)), "token": ""},
                 "event": {"sender": {"sender_id": {"open_id": "ou_alice"}, "sender_type": "user"},
                           "message": {"message_id": "om_ws_1", "chat_id": "oc_ws", "chat_type": "p2p",
                                       "message_type": "text", "content": json.dumps({"text": "/amux"})}}}
        # The SDK's websocket client calls this on its own thread for every EVENT frame.
        await asyncio.to_thread(handler._do_without_validation, json.dumps(frame).encode())
        for _ in range(200):
            if sink.replies:
                break
            await asyncio.sleep(0.02)
        assert sink.replies and sink.replies[0]["msg_type"] == "interactive"
        assert sink.replies[0]["reply_to"] == "om_ws_1"
        await asyncio.to_thread(handler._do_without_validation, json.dumps(frame).encode())  # a redelivered frame
        await asyncio.sleep(0.2)
        assert len(sink.replies) == 1
    finally:
        await hub.db.close()
