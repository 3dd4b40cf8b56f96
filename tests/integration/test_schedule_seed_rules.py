"""Seed rules of scheduled subtasks, over the official MCP client against a hub with a real runner, on both stores:
a scheduled subtask's structured question fails it with the bilingual diagnostic, and pausing or deleting a schedule
never cancels a Task it already admitted."""
from __future__ import annotations

import pytest

from tests.helpers import eventually, mcp_client
from tests.integration.test_schedules_mcp import fast, ledger_of


async def reconciled(c, sid: str) -> list[dict]:  # noqa: ANN001
    """Wait until the schedule's first firing has its reconciled outcome; return the ledger."""
    async def settled():
        rows = await ledger_of(c, sid)
        return rows if rows and rows[0]["outcome"] else None

    return await eventually(settled, timeout=30)


async def test_a_scheduled_subtask_whose_agent_asks_a_structured_question_fails_with_the_bilingual_diagnostic(any_hub):
    fast(any_hub)
    await any_hub.start_runner()
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        for policy in ("policy-allow", "deny-all"):  # under every policy a scheduled subtask may carry
            res = await c.call_tool("schedule_create", {
                "name": f"asks {policy}", "prompt": "say looking\nask 'which branch?'", "rule": "every 5m",
                "profile": "scripted", "permission_policy": policy})
            assert not res.is_error, res
            sid = res.structured_content["schedule_id"]
            any_hub.clock.advance(300)
            any_hub.hub.schedule_firing.kick()
            [f] = await reconciled(c, sid)
            assert f["admission"] == "ok" and f["outcome"] == "failed"
            task = (await c.call_tool("task_get", {"task_id": f["task_id"]})).structured_content
            assert task["status"] == "failed"
            assert "interactive session" in task["error"] and "交互式会话" in task["error"]  # English and Chinese
            await c.call_tool("schedule_delete", {"schedule_id": sid})


@pytest.mark.parametrize("stop", ["schedule_delete", "schedule_pause"])
async def test_deleting_or_pausing_a_schedule_does_not_cancel_its_admitted_task(any_hub, stop):
    fast(any_hub)
    await any_hub.start_runner(slots=1)
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        busy = (await c.call_tool("task_submit", {"prompt": "sleep 60", "profile": "scripted"})).structured_content

        async def busy_running():
            return (await c.call_tool("task_get", {"task_id": busy["task_id"]})).structured_content["status"] \
                == "running"

        await eventually(busy_running, timeout=30)
        sid = (await c.call_tool("schedule_create", {"name": "nightly", "prompt": "say from the schedule",
                                                     "rule": "every 5m", "profile": "scripted"})
               ).structured_content["schedule_id"]
        any_hub.clock.advance(300)
        any_hub.hub.schedule_firing.kick()

        async def admitted():
            rows = await ledger_of(c, sid)
            return rows[0] if rows and rows[0]["task_id"] else None

        firing = await eventually(admitted, timeout=30)  # admitted, queued behind the busy task (one slot)
        assert firing["admission"] == "ok"
        stopped = await c.call_tool(stop, {"schedule_id": sid})
        assert not stopped.is_error, stopped
        queued = (await c.call_tool("task_get", {"task_id": firing["task_id"]})).structured_content
        assert queued["status"] in ("queued", "dispatched")
        await c.call_tool("task_cancel", {"task_id": busy["task_id"]})  # free the slot: the admitted task runs

        async def finished():
            t = (await c.call_tool("task_get", {"task_id": firing["task_id"]})).structured_content
            return t if t["status"] not in ("queued", "dispatched", "running") else None

        done = await eventually(finished, timeout=30)
        assert done["status"] == "succeeded" and done["result"]["text"] == "from the schedule"
