"""Schedules through the official MCP client, REST and the CLI, on a real hub with a real runner."""
from __future__ import annotations

import json

from tests.helpers import eventually, mcp_client
from tests.integration.test_cli_rest import amux


def fast(handle) -> None:
    handle.hub.settings.schedules.reconcile_s = 0.05
    handle.hub.settings.schedules.poll_s = 0.05
    # These tests jump the clock by minutes; the runner's real heartbeats (every few seconds) must not make its
    # runtime look lost meanwhile (that rule has tests of its own).
    handle.hub.settings.hub.runtime_lost_s = 3600


async def ledger_of(c, sid: str) -> list[dict]:
    return (await c.call_tool("schedule_history", {"schedule_id": sid})).structured_content["firings"]


async def test_schedule_tools_create_get_list_update_pause_resume_delete_and_readback(hub):
    fast(hub)
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        res = await c.call_tool("schedule_create", {
            "name": "tick", "prompt": "say tick", "rule": "*/5 * * * *", "timezone": "Asia/Shanghai",
            "profile": "scripted", "runtime": "r1", "model": "m-1", "extra_args": ["--x"],
            "permission_policy": "deny-all"})
        assert not res.is_error, res
        sid = res.structured_content["schedule_id"]
        got = (await c.call_tool("schedule_get", {"schedule_id": sid})).structured_content
        assert (got["runtime"], got["model"], got["permission_policy"], got["extra_args"], got["schedule_type"]) == (
            "r1", "m-1", "deny-all", ["--x"], "subtask")
        listed = (await c.call_tool("schedule_list", {})).structured_content["schedules"]
        assert [s["schedule_id"] for s in listed] == [sid] and listed[0]["runtime"] == "r1"
        upd = (await c.call_tool("schedule_update",
                                 {"schedule_id": sid, "model": "", "rule": "every 2h"})).structured_content
        assert upd["model"] is None and upd["rule"] == "every 2h" and upd["runtime"] == "r1"
        assert (await c.call_tool("schedule_pause", {"schedule_id": sid})).structured_content["paused"] is True
        assert (await c.call_tool("schedule_resume", {"schedule_id": sid})).structured_content["paused"] is False
        assert (await c.call_tool("schedule_delete", {"schedule_id": sid})).structured_content["deleted"] is True
        gone = await c.call_tool("schedule_get", {"schedule_id": sid})
        assert gone.is_error and "schedule_list" in gone.content[0].text


async def test_schedule_create_refuses_escalate_to_main_and_bad_rules_with_the_fix(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        res = await c.call_tool("schedule_create", {"prompt": "say x", "rule": "every 5m", "profile": "scripted",
                                                    "permission_policy": "escalate-to-main"})
        assert res.is_error and "scheduled subtasks" in res.content[0].text
        res = await c.call_tool("schedule_create", {"prompt": "say x", "rule": "daily", "profile": "scripted"})
        assert res.is_error and "every 30s" in res.content[0].text
        assert "at 2026-12-01T09:00:00+08:00" in res.content[0].text


async def test_a_fire_admits_a_task_the_runner_runs_and_the_reconciled_outcome_shows_in_history(hub):
    fast(hub)
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        sid = (await c.call_tool("schedule_create", {"name": "t", "prompt": "say from schedule", "rule": "every 5m",
                                                     "profile": "scripted"})).structured_content["schedule_id"]
        hub.clock.advance(300)
        hub.hub.schedule_firing.kick()

        async def reconciled():
            rows = await ledger_of(c, sid)
            return rows if rows and rows[0]["outcome"] else None

        [f] = await eventually(reconciled, timeout=20)
        assert f["admission"] == "ok" and f["receipt"] == f"ok:task:{f['task_id']}" and f["outcome"] == "succeeded"
        task = (await c.call_tool("task_get", {"task_id": f["task_id"]})).structured_content
        assert task["result"]["text"] == "from schedule"


async def test_a_session_prompt_schedule_submits_a_turn_into_the_session_and_reconciles_it(hub):
    fast(hub)
    await hub.start_runner()
    caller = await hub.hub.auth.authenticate(hub.admin_token)
    session = await hub.hub.sessions.create(caller, name="desk", profile="scripted")
    async with mcp_client(hub.url, hub.admin_token) as c:
        res = await c.call_tool("schedule_create", {"name": "nudge", "prompt": "say nudged", "rule": "every 1m",
                                                    "schedule_type": "session-prompt", "session_ref": "desk"})
        assert not res.is_error, res
        assert res.structured_content["session_ref"] == session["session_id"]
        sid = res.structured_content["schedule_id"]
        hub.clock.advance(60)
        hub.hub.schedule_firing.kick()

        async def reconciled():
            rows = await ledger_of(c, sid)
            return rows if rows and rows[0]["outcome"] else None

        [f] = await eventually(reconciled, timeout=20)
        assert f["turn_id"] and f["task_id"] is None and f["outcome"] == "succeeded"


async def test_cli_schedule_create_list_pause_resume_history_delete_with_json(hub):
    await hub.start_runner()
    env = {"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}
    code, out, err = await amux("schedule", "create", "--type", "subtask", "--rule", "every 5m", "--prompt", "say hi",
                                "--profile", "scripted", "--name", "cli", "--json", env=env)
    assert code == 0, err
    s = json.loads(out)
    assert s["schedule_type"] == "subtask" and s["profile"] == "scripted"
    code, out, _ = await amux("schedule", "list", "--json", env=env)
    assert [x["schedule_id"] for x in json.loads(out)["schedules"]] == [s["schedule_id"]]
    code, out, _ = await amux("schedule", "pause", s["schedule_id"], "--json", env=env)
    assert json.loads(out)["paused"] is True
    code, out, _ = await amux("schedule", "resume", s["schedule_id"], env=env)
    assert code == 0 and "next" in out
    code, out, _ = await amux("schedule", "history", s["schedule_id"], "--json", env=env)
    assert json.loads(out)["firings"] == []
    code, out, _ = await amux("schedule", "delete", s["schedule_id"], "--json", env=env)
    assert json.loads(out)["deleted"] is True
    # session-prompt is the CLI default; the session-ref falls back to AMUX_SESSION_ID
    code, _, err = await amux("schedule", "create", "--rule", "every 5m", "--prompt", "hi",
                              env={**env, "AMUX_SESSION_ID": "ghost"})
    assert code == 3 and "ghost" in err
    async with hub.hub.db.read() as conn:
        import sqlalchemy as sa

        from hub.store.tables import schedules
        prov = (await conn.execute(sa.select(schedules.c.provenance))).scalar()
    assert prov["source"] == "cli"
