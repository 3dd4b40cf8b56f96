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
