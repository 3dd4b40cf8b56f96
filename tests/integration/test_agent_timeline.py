"""The Agent Timeline: raw agent events per Task and Turn (owner and admins only, secrets cut, swept after the
retention) on REST and MCP, while task events stay redacted."""
from __future__ import annotations

import json
from typing import Any

import httpx2
import sqlalchemy as sa

from hub.clock import ManualClock
from hub.domain.timeline import raw_payload, scrub_text
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import timeline_events
from tests.helpers import mcp_client, start_hub

SECRET = "sk-ant-a9f8e7d6c5b4-timeline-never"
SCRIPT = "say looking\ntool Bash 'grep -rn TODO src'\nsay done"


async def get(url: str, path: str, token: str, **params: Any) -> httpx2.Response:
    async with httpx2.AsyncClient() as http:
        return await http.get(f"{url}{path}", params=params, headers={"Authorization": f"Bearer {token}"})


async def run_task(hub, token: str, prompt: str = SCRIPT, **kw: Any) -> str:
    caller = await hub.hub.auth.authenticate(token)
    sub = await hub.hub.tasks.submit(caller, SubmitRequest(prompt=prompt, profile="scripted", **kw))
    view = await hub.hub.tasks.wait_terminal(caller, sub["task_id"], timeout_s=20)
    assert view["status"] == "succeeded", view
    return sub["task_id"]


async def test_the_timeline_keeps_raw_tool_input_and_output_while_task_events_stay_redacted(hub):
    await hub.start_runner()
    alice = await hub.token("alice")
    task_id = await run_task(hub, alice)
    tl = await get(hub.url, f"/api/v1/tasks/{task_id}/timeline", alice)
    assert tl.status_code == 200, tl.text
    body = tl.json()
    assert body["task_id"] == task_id and body["done"] and body["retention_s"] == 14 * 86400
    tool = next(e for e in body["events"] if e["type"] == "tool")["tool"]
    assert tool["input"] == {"title": "grep -rn TODO src"} and tool["output"] == "Bash done"
    assert [e["text"] for e in body["events"] if e["type"] == "text"] == ["looking", "done"]
    events = (await get(hub.url, f"/api/v1/tasks/{task_id}/events", alice)).json()["events"]
    task_tool = next(e for e in events if e["type"] == "tool")["tool"]
    assert set(task_tool) == {"id", "name", "title", "status"}  # TaskEvents stay redacted
    # The cursor pages: after the last event there is nothing more.
    later = (await get(hub.url, f"/api/v1/tasks/{task_id}/timeline", alice, cursor=body["cursor"])).json()
    assert later["events"] == [] and later["cursor"] == body["cursor"]


async def test_another_users_task_timeline_is_404_and_an_admin_reads_it(hub):
    await hub.start_runner()
    alice, bob = await hub.token("alice"), await hub.token("bob")
    task_id = await run_task(hub, alice)
    refused = await get(hub.url, f"/api/v1/tasks/{task_id}/timeline", bob)
    missing = await get(hub.url, "/api/v1/tasks/tr_nosuchtask/timeline", bob)
    assert refused.status_code == missing.status_code == 404
    assert refused.json()["error"].replace(task_id, "X") == missing.json()["error"].replace("tr_nosuchtask", "X")
    assert (await get(hub.url, f"/api/v1/tasks/{task_id}/timeline", hub.admin_token)).status_code == 200
    # A task is not a turn: the other door answers 404 too.
    assert (await get(hub.url, f"/api/v1/turns/{task_id}/timeline", alice)).status_code == 404


async def test_a_turns_timeline_is_read_on_the_turns_door(hub):
    await hub.start_runner()
    alice = await hub.token("alice")
    caller = await hub.hub.auth.authenticate(alice)
    session = await hub.hub.sessions.create(caller, profile="scripted")
    turn_id = await hub.hub.sessions.submit_turn(caller, session["session_id"], SCRIPT, source="rest")
    assert (await hub.hub.sessions.wait_turn(caller, turn_id, 20))["status"] == "succeeded"
    tl = await get(hub.url, f"/api/v1/turns/{turn_id}/timeline", alice)
    assert tl.status_code == 200 and tl.json()["turn_id"] == turn_id
    assert any(e["type"] == "tool" and e["tool"]["input"] for e in tl.json()["events"])
    assert (await get(hub.url, f"/api/v1/tasks/{turn_id}/timeline", alice)).status_code == 404
    assert (await get(hub.url, f"/api/v1/turns/{turn_id}/timeline", await hub.token("bob"))).status_code == 404


async def test_task_timeline_over_mcp_answers_the_owner_and_refuses_others_and_bad_arguments(hub):
    await hub.start_runner()
    alice, bob = await hub.token("alice"), await hub.token("bob")
    task_id = await run_task(hub, alice)
    async with mcp_client(hub.url, alice) as client:
        res = await client.call_tool("task_timeline", {"task_id": task_id})
        assert not res.is_error, res.content[0].text
        assert any(e["type"] == "tool" for e in res.structured_content["events"])
        both = await client.call_tool("task_timeline", {"task_id": task_id, "turn_id": "turn_x"})
        assert both.is_error and "exactly one of task_id" in both.content[0].text
        typo = await client.call_tool("task_timeline", {"task": task_id})
        assert typo.is_error and "task_timeline has no argument 'task'" in typo.content[0].text
    async with mcp_client(hub.url, bob) as client:
        other = await client.call_tool("task_timeline", {"task_id": task_id})
        assert other.is_error and "does not exist or is not yours" in other.content[0].text


async def test_credential_values_and_tokens_never_reach_the_timeline(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    await hub.hub.credentials.declare(admin, "anthropic", ["ANTHROPIC_API_KEY"])
    await hub.hub.credentials.set_value(admin, "anthropic", "ANTHROPIC_API_KEY", SECRET)
    token = await hub.token("carol")
    script = (f"env ANTHROPIC_API_KEY\ntool Bash 'curl -H \"Authorization: Bearer {SECRET}\" {token}'\n"
              "tool Bash 'export GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123'")
    task_id = await run_task(hub, hub.admin_token, script, credential_profile="anthropic")
    async with hub.hub.db.read() as conn:
        rows = [r.payload for r in await conn.execute(sa.select(timeline_events.c.payload)
                                                     .where(timeline_events.c.run_id == task_id))]
    dump = json.dumps(rows)
    assert rows and "[redacted]" in dump
    secret_of_token = token.split(".")[2]
    for leaked in (SECRET, secret_of_token, "ghp_abcdefghijklmnopqrstuvwxyz0123"):
        assert leaked not in dump


def test_raw_payloads_are_bounded_and_key_named_secrets_are_cut():
    raw = raw_payload({"tool": {"output": "x" * 100_000, "input": {"password": "hunter2", "path": "a.txt"}}})
    assert len(raw["tool"]["output"]) < 70_000 and raw["tool"]["output"].endswith("characters not kept]")
    assert raw["tool"]["input"] == {"password": "[redacted]", "path": "a.txt"}
    assert scrub_text("Authorization: Bearer abcdefghijklmnop1234") == "Authorization: Bearer [redacted]"
    assert scrub_text("amux.tok_abc123.S3cretS3cretS3cret") == "amux.tok_abc123.[redacted]"


async def test_the_sweeper_deletes_timeline_events_past_the_retention_and_keeps_newer_ones(hub):
    await hub.start_runner()
    alice = await hub.token("alice")
    old = await run_task(hub, alice)
    hub.clock.advance(seconds=hub.hub.settings.timeline.retention_s - 60)
    new = await run_task(hub, alice)
    hub.clock.advance(seconds=120)  # `old` is past the retention now, `new` is not
    await hub.hub.timeline.sweep_step()
    assert (await get(hub.url, f"/api/v1/tasks/{old}/timeline", alice)).json()["events"] == []
    assert (await get(hub.url, f"/api/v1/tasks/{new}/timeline", alice)).json()["events"]
    assert (await get(hub.url, f"/api/v1/tasks/{old}/events", alice)).json()["events"]  # task history stays


async def test_the_timeline_is_kept_read_and_swept_alike_on_each_store(db_url, tmp_path):
    handle = await start_hub(db_url, tmp_path, ManualClock())
    try:
        await handle.start_runner()
        alice = await handle.token("alice")
        task_id = await run_task(handle, alice)
        caller = await handle.hub.auth.authenticate(alice)
        view = await handle.hub.timeline.read(caller, "task", task_id)
        assert [e["type"] for e in view["events"]] == ["text", "tool", "text"]
        assert view["events"][1]["tool"]["input"] == {"title": "grep -rn TODO src"}
        handle.clock.advance(seconds=handle.hub.settings.timeline.retention_s + 1)
        await handle.hub.timeline.sweep_step()
        assert (await handle.hub.timeline.read(caller, "task", task_id))["events"] == []
    finally:
        await handle.stop()
