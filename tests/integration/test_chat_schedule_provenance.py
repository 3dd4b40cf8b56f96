"""A schedule created from Feishu chat records the exact Turn receipt as its provenance."""
from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import sqlalchemy as sa

from bot.console import ConsoleSink
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.services.schedules.service import ScheduleSpec
from hub.store.tables import identity_bindings, schedules, task_runs
from tests.helpers import eventually, mcp_client, start_hub, turn_child_env


def message(event_id: str, message_id: str, open_id: str, text: str) -> dict:
    event = {"sender": {"sender_id": {"open_id": open_id}, "sender_type": "user"},
             "message": {"message_id": message_id, "chat_id": "oc_group", "chat_type": "group", "message_type": "text",
                         "content": json.dumps({"text": text})}}
    return {"schema": "2.0", "header": {"event_id": event_id, "event_type": "im.message.receive_v1"}, "event": event}


async def test_a_schedule_made_during_a_feishu_turn_is_attributed_to_that_turns_receipt_only(
        sqlite_url: str, tmp_path: Path, clock: ManualClock):
    app = FeishuAppSettings(app_id="cli_prov", verification_token="vt", admin_open_id="ou_boss", profile="scripted")
    handle = await start_hub(sqlite_url, tmp_path, clock, feishu_apps=[app])
    hub, admin = handle.hub, handle.admin_token
    try:
        await handle.start_runner(slots=4)
        # alice's message starts a Turn that stays open while "her agent" creates a schedule
        _, work = await hub.bot.core.accept("cli_prov", message("ev1", "om_alice", "ou_alice", "wait-steer 20"),
                                            ConsoleSink())
        work = asyncio.ensure_future(work)  # the webhook runs the slow part after answering

        async def alice_turn():
            async with hub.db.read() as conn:
                return (await conn.execute(sa.select(task_runs).where(
                    task_runs.c.kind == "turn", task_runs.c.status == "running"))).first()

        turn = await eventually(alice_turn)
        # bob speaks later in the same chat: he is the latest speaker, and must not be the creator
        _, bob_work = await hub.bot.core.accept("cli_prov", message("ev2", "om_bob", "ou_bob", "say hi"), ConsoleSink())
        await asyncio.wait_for(bob_work, 30)
        async with hub.db.write() as conn:
            env = await turn_child_env(hub, conn, turn.owner_id, turn.session_id)
        agent = await hub.auth.authenticate(env["AMUX_TOKEN"])
        made = await hub.schedules.create(agent, ScheduleSpec(prompt="say nightly", rule="every 1h"))
        plain = await hub.schedules.create(await hub.auth.authenticate(await hub.auth.create_token("carol")),
                                           ScheduleSpec(prompt="say nightly", rule="every 1h"))
        async with hub.db.read() as conn:
            rows = {r.id: r for r in await conn.execute(sa.select(schedules))}
            alice = (await conn.execute(sa.select(identity_bindings)
                                        .where(identity_bindings.c.open_id == "ou_alice"))).one()
        s = rows[made["schedule_id"]]
        assert (s.creator_id, s.creator_binding_id, s.app_id) == (alice.principal_id, alice.id, "cli_prov")
        assert s.provenance["turn_id"] == turn.id and s.provenance["receipt"]["message_id"] == "om_alice"
        p = rows[plain["schedule_id"]]
        assert (p.creator_binding_id, p.app_id) == (None, None)  # no Feishu Turn behind it: unattributed
        await hub.tasks.cancel(await hub.auth.authenticate(admin), turn.id)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(work, 10)
    finally:
        await handle.stop()


async def test_a_schedule_made_from_a_feishu_chat_without_a_timezone_takes_its_apps_timezone(
        db_url: str, tmp_path: Path, clock: ManualClock):
    app = FeishuAppSettings(app_id="cli_tz", verification_token="vt", admin_open_id="ou_boss",
                            profile="scripted")  # timezone: default
    handle = await start_hub(db_url, tmp_path, clock, feishu_apps=[app])
    hub = handle.hub
    try:
        await handle.start_runner(slots=4)
        hub.bot.core.turn_wait_s = 30
        _, work = await hub.bot.core.accept("cli_tz", message("ev1", "om_alice", "ou_alice", "wait-steer 20"),
                                            ConsoleSink())
        work = asyncio.ensure_future(work)

        async def alice_turn():
            async with hub.db.read() as conn:
                return (await conn.execute(sa.select(task_runs).where(
                    task_runs.c.kind == "turn", task_runs.c.status == "running"))).first()

        turn = await eventually(alice_turn)
        async with hub.db.write() as conn:
            env = await turn_child_env(hub, conn, turn.owner_id, turn.session_id)
        async with mcp_client(handle.url, env["AMUX_TOKEN"]) as c:   # her agent, during her Feishu Turn
            made = (await c.call_tool("schedule_create", {"prompt": "say nightly", "rule": "0 9 * * *"}))
            given = (await c.call_tool("schedule_create", {"prompt": "say nightly", "rule": "0 9 * * *",
                                                           "timezone": "UTC"}))
        async with mcp_client(handle.url, await hub.auth.create_token("carol")) as c:  # no Feishu chat behind it
            plain = (await c.call_tool("schedule_create", {"prompt": "say nightly", "rule": "0 9 * * *"}))
        made, given, plain = (r.structured_content for r in (made, given, plain))
        # 09:00 in Shanghai is 01:00 UTC; the clock reads 2026-01-05 09:00 UTC (17:00 in Shanghai)
        assert (made["timezone"], made["next_fire_at"]) == ("Asia/Shanghai", "2026-01-06T01:00:00+00:00"), made
        assert (given["timezone"], given["next_fire_at"]) == ("UTC", "2026-01-06T09:00:00+00:00")  # as asked
        assert (plain["timezone"], plain["next_fire_at"]) == ("UTC", "2026-01-06T09:00:00+00:00")  # the default
        async with hub.db.read() as conn:
            prov = (await conn.execute(sa.select(schedules.c.provenance)
                                       .where(schedules.c.id == made["schedule_id"]))).scalar()
        assert prov["timezone"] == {"basis": "app", "app_id": "cli_tz", "timezone": "Asia/Shanghai"}
        await hub.tasks.cancel(await hub.auth.authenticate(handle.admin_token), turn.id)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(work, 10)
    finally:
        await handle.stop()
