"""A schedule's overlap policy: a Task that outlives its interval, then fires under allow, skip and
replace — on both stores, with the injected clock, checked through MCP `schedule_history` and the Task records."""
from __future__ import annotations

import json

import aiohttp
import sqlalchemy as sa

from hub.store.tables import decisions
from tests.helpers import eventually, mcp_client
from tests.integration.test_cli_rest import amux
from tests.integration.test_schedules_mcp import fast, ledger_of

LONG = "sleep 60\nsay done"  # real seconds: it outlives every interval the clock jumps over


async def _status(c, task_id: str) -> str:
    return (await c.call_tool("task_get", {"task_id": task_id})).structured_content["status"]


async def _fire(handle, c, sid: str, count: int) -> list[dict]:
    """Move the clock one interval, wake the firing loop, and return the ledger once it has `count` recorded rows."""
    handle.clock.advance(60)
    handle.hub.schedule_firing.kick()

    async def recorded():
        rows = await ledger_of(c, sid)
        return rows if len(rows) == count and all(r["admission"] for r in rows) else None

    return await eventually(recorded, timeout=20)


async def _first_running(handle, c, overlap: str) -> tuple[str, str]:
    """Create an every-minute schedule with `overlap`, fire it once, and wait until its Task runs."""
    fast(handle)
    await handle.start_runner()
    res = await c.call_tool("schedule_create", {"name": f"long-{overlap}", "prompt": LONG, "rule": "every 1m",
                                                "profile": "scripted", "overlap": overlap})
    assert not res.is_error, res
    assert res.structured_content["overlap"] == overlap
    sid = res.structured_content["schedule_id"]
    [first] = await _fire(handle, c, sid, 1)
    assert first["admission"] == "ok"

    async def running():
        return await _status(c, first["task_id"]) == "running"

    await eventually(running, timeout=20)
    return sid, first["task_id"]


async def test_allow_admits_a_second_task_beside_the_unfinished_one(any_hub):
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        sid, first = await _first_running(any_hub, c, "allow")
        second, older = await _fire(any_hub, c, sid, 2)
        assert (second["admission"], older["task_id"]) == ("ok", first)

        async def both_running():
            return [await _status(c, t) for t in (first, second["task_id"])] == ["running", "running"]

        await eventually(both_running, timeout=20)


async def test_skip_admits_nothing_while_the_previous_task_is_unfinished_and_records_skipped_overlap(any_hub):
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        sid, first = await _first_running(any_hub, c, "skip")
        skipped, older = await _fire(any_hub, c, sid, 2)
        assert (skipped["admission"], skipped["receipt"], skipped["task_id"]) == ("skipped:overlap",
                                                                                 "skipped:overlap", None)
        assert skipped["outcome"] is None and skipped["reconciled_at"] is not None  # admission, not an outcome
        assert older["task_id"] == first and await _status(c, first) == "running"
        caller = await any_hub.hub.auth.authenticate(any_hub.admin_token)
        assert [t["task_id"] for t in await any_hub.hub.tasks.list(caller)] == [first]  # one Task record

        # the alert rules see it as neither failure nor missed run: decided, no incident
        async def decided():
            async with any_hub.hub.db.read() as conn:
                return (await conn.execute(sa.select(decisions.c.decision, decisions.c.incident_id)
                                           .where(decisions.c.firing_id == skipped["firing_id"]))).all()

        assert [tuple(r) for r in await eventually(decided, timeout=10)] == [("overlap_skipped", None)]


async def test_replace_cancels_the_unfinished_task_then_admits_the_new_one(any_hub):
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        sid, first = await _first_running(any_hub, c, "replace")
        second, older = await _fire(any_hub, c, sid, 2)
        assert second["admission"] == "ok" and second["task_id"] != first and older["task_id"] == first

        async def replaced():
            rows = await ledger_of(c, sid)
            return rows if rows[1]["outcome"] == "cancelled" else None

        rows = await eventually(replaced, timeout=20)
        assert await _status(c, first) == "cancelled"
        assert rows[0]["task_id"] == second["task_id"] and rows[0]["outcome"] is None

        async def new_one_running():
            return await _status(c, second["task_id"]) == "running"

        await eventually(new_one_running, timeout=20)


async def test_skip_admits_again_once_the_previous_task_finished(any_hub):
    fast(any_hub)
    await any_hub.start_runner()
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        sid = (await c.call_tool("schedule_create", {"prompt": "say quick", "rule": "every 1m", "profile": "scripted",
                                                     "overlap": "skip"})).structured_content["schedule_id"]
        [first] = await _fire(any_hub, c, sid, 1)

        async def finished():
            return await _status(c, first["task_id"]) == "succeeded"

        await eventually(finished, timeout=20)
        second, _ = await _fire(any_hub, c, sid, 2)
        assert second["admission"] == "ok" and second["task_id"] != first["task_id"]


async def test_overlap_is_set_and_read_back_over_mcp_rest_and_the_cli(hub):
    await hub.start_runner()
    env = {"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}
    code, out, err = await amux("schedule", "create", "--type", "subtask", "--rule", "@daily", "--prompt", "say hi",
                                "--profile", "scripted", "--overlap", "skip", "--json", env=env)
    assert code == 0, err
    s = json.loads(out)
    assert (s["overlap"], s["rule"]) == ("skip", "@daily")
    code, out, err = await amux("schedule", "update", s["schedule_id"], "--overlap", "replace", "--json", env=env)
    assert code == 0 and json.loads(out)["overlap"] == "replace", err
    code, out, _ = await amux("schedule", "get", s["schedule_id"], env=env)
    assert "overlap=replace" in out
    headers = {"Authorization": f"Bearer {hub.admin_token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        url = f"{hub.url}/api/v1/schedules"
        async with http.patch(f"{url}/{s['schedule_id']}", json={"overlap": "allow"}) as r:
            assert r.status == 200 and (await r.json())["overlap"] == "allow"
        async with http.post(url, json={"prompt": "say x", "rule": "@hourly", "profile": "scripted",
                                        "overlap": "skip"}) as r:
            assert r.status == 201 and (await r.json())["overlap"] == "skip"
        async with http.get(url) as r:
            assert sorted(x["overlap"] for x in (await r.json())["schedules"]) == ["allow", "skip"]
        async with http.post(url, json={"prompt": "say x", "rule": "@hourly", "overlap": "never"}) as r:
            assert r.status == 400 and "overlap" in (await r.text())
    async with mcp_client(hub.url, hub.admin_token) as c:
        got = (await c.call_tool("schedule_get", {"schedule_id": s["schedule_id"]})).structured_content
        assert got["overlap"] == "allow"
        upd = await c.call_tool("schedule_update", {"schedule_id": s["schedule_id"], "overlap": "skip"})
        assert upd.structured_content["overlap"] == "skip"
        bad = await c.call_tool("schedule_update", {"schedule_id": s["schedule_id"], "overlap": "forbid"})
        assert bad.is_error and '"skip"' in bad.content[0].text and '"replace"' in bad.content[0].text
        listed = (await c.call_tool("schedule_list", {})).structured_content["schedules"]
        assert {x["schedule_id"]: x["overlap"] for x in listed}[s["schedule_id"]] == "skip"


async def test_a_session_prompt_schedule_refuses_skip_and_replace_naming_the_fix(hub):
    await hub.start_runner()
    caller = await hub.hub.auth.authenticate(hub.admin_token)
    await hub.hub.sessions.create(caller, name="desk", profile="scripted")
    async with mcp_client(hub.url, hub.admin_token) as c:
        for overlap in ("skip", "replace"):
            res = await c.call_tool("schedule_create", {"prompt": "say x", "rule": "every 5m", "overlap": overlap,
                                                        "schedule_type": "session-prompt", "session_ref": "desk"})
            assert res.is_error and "queue in their Session" in res.content[0].text
            assert 'schedule_type "subtask"' in res.content[0].text
        ok = await c.call_tool("schedule_create", {"prompt": "say x", "rule": "every 5m", "overlap": "allow",
                                                   "schedule_type": "session-prompt", "session_ref": "desk"})
        assert not ok.is_error and ok.structured_content["overlap"] == "allow"
