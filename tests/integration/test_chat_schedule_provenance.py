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
from hub.services.schedules import ScheduleSpec
from hub.store.tables import identity_bindings, schedules, task_runs
from tests.helpers import eventually, start_hub


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
            env = await hub.runtimes.coordination_env(conn, turn.owner_id, turn.session_id)
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
