"""Run now: MCP `schedule_run_now` fires a schedule once, at once — a manual firing ledgered like any
other and correlated to its Task, the rule's next fire time unmoved; the rule's own firings go on beside it."""
from __future__ import annotations

import json

import sqlalchemy as sa

from hub.store.tables import decisions

from tests.helpers import eventually, mcp_client
from tests.integration.test_cli_rest import amux
from tests.integration.test_schedules_mcp import fast, ledger_of


async def test_run_now_adds_one_manual_firing_with_its_task_and_keeps_the_next_fire_time(any_hub):
    fast(any_hub)
    await any_hub.start_runner()
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        res = await c.call_tool("schedule_create", {"name": "nightly", "prompt": "say hi", "rule": "@daily",
                                                    "profile": "scripted"})
        assert not res.is_error, res
        sid, nxt = res.structured_content["schedule_id"], res.structured_content["next_fire_at"]
        ran = await c.call_tool("schedule_run_now", {"schedule_id": sid})
        assert not ran.is_error, ran
        f = ran.structured_content
        assert f["manual"] is True and f["admission"] == "ok" and f["receipt"] == f"ok:task:{f['task_id']}"
        got = (await c.call_tool("schedule_get", {"schedule_id": sid})).structured_content
        assert got["next_fire_at"] == nxt  # the rule did not move

        async def settled():
            rows = await ledger_of(c, sid)
            return rows if rows and rows[0]["outcome"] else None

        [row] = await eventually(settled, timeout=20)
        assert (row["firing_id"], row["manual"], row["outcome"]) == (f["firing_id"], True, "succeeded")
        task = (await c.call_tool("task_get", {"task_id": f["task_id"]})).structured_content
        assert task["status"] == "succeeded"
        # a second press is a second manual firing (its own nominal time), never a collision
        again = (await c.call_tool("schedule_run_now", {"schedule_id": sid})).structured_content
        assert again["firing_id"] != f["firing_id"] and again["manual"]
        # the rule's own firing still comes at its time, not manual
        any_hub.clock.advance(86_400)
        any_hub.hub.schedule_firing.kick()

        async def three():
            rows = await ledger_of(c, sid)
            return rows if len(rows) == 3 else None

        rows = await eventually(three, timeout=20)
        assert sorted(r["manual"] for r in rows) == [False, True, True]


async def test_run_now_of_someone_elses_schedule_is_refused(any_hub):
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        res = await c.call_tool("schedule_run_now", {"schedule_id": "sch_nope"})
        assert res.is_error


async def test_cli_run_now_fires_once_over_rest(any_hub):
    fast(any_hub)
    await any_hub.start_runner()
    env = {"AMUX_HUB_URL": any_hub.url, "AMUX_TOKEN": any_hub.admin_token}
    code, out, err = await amux("schedule", "create", "--type", "subtask", "--rule", "@daily", "--prompt", "say hi",
                                "--profile", "scripted", "--json", env=env)
    assert code == 0, err
    sid = json.loads(out)["schedule_id"]
    code, out, err = await amux("schedule", "run-now", sid, "--json", env=env)
    assert code == 0, err
    f = json.loads(out)
    assert f["manual"] is True and f["admission"] == "ok" and f["task_id"]
    code, out, err = await amux("schedule", "run-now", sid, env=env)
    assert code == 0 and f"{sid}: manual firing fir" in out, err
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        assert [r["manual"] for r in await ledger_of(c, sid)] == [True, True]


async def test_a_failed_manual_run_goes_through_the_same_alert_rules(any_hub):
    fast(any_hub)
    await any_hub.start_runner()
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        res = await c.call_tool("schedule_create", {"name": "breaks", "prompt": "fail boom", "rule": "@daily",
                                                    "profile": "scripted"})
        sid = res.structured_content["schedule_id"]
        f = (await c.call_tool("schedule_run_now", {"schedule_id": sid})).structured_content

        async def decided():
            async with any_hub.hub.db.read() as conn:
                return (await conn.execute(sa.select(decisions.c.decision)
                                           .where(decisions.c.firing_id == f["firing_id"]))).scalars().all()

        assert await eventually(decided, timeout=20)  # the alert pipeline decided on it like any firing
        [row] = await ledger_of(c, sid)
        assert (row["manual"], row["outcome"]) == (True, "failed")
