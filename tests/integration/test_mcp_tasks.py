"""Tasks over the official MCP SDK client against a running hub."""
from __future__ import annotations



from tests.helpers import mcp_client

SCRIPT = "say hello\ntool Read 'read the readme'\nusage input=10 output=5\nwrite notes/out.txt hi\nsay done"


async def test_task_run_over_mcp_reaches_succeeded_with_result_usage_and_changed_files(any_hub):
    await any_hub.start_runner()
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        res = await c.call_tool("task_run", {"prompt": SCRIPT, "profile": "scripted", "name": "demo"})
    assert not res.is_error, res.content
    t = res.structured_content
    assert t["status"] == "succeeded" and t["outcome"] == "succeeded"
    assert t["result"]["text"] == "hello\ndone"
    assert t["usage"] == {"input_tokens": 10, "output_tokens": 5}
    assert t["changed_files"]["created"] == ["notes/out.txt"]
    assert t["snapshot"]["engine"] == "scripted" and t["snapshot"]["permission_policy"] == "policy-allow"


async def test_mcp_without_or_with_a_wrong_token_answers_401_naming_the_fix(hub):
    import httpx2

    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx2.AsyncClient() as http:
        for headers in ({}, {"Authorization": "Bearer amux.nope.nope"}):
            resp = await http.post(f"{hub.url}/mcp", json=body,
                                   headers={**headers, "Accept": "application/json, text/event-stream"})
            assert resp.status_code == 401
            assert "amux token create" in resp.json()["error_description"]


async def test_rest_without_a_token_answers_401_naming_the_fix(hub):
    import httpx2

    async with httpx2.AsyncClient() as http:
        resp = await http.get(f"{hub.url}/api/v1/tasks")
    assert resp.status_code == 401 and "amux token create" in resp.json()["message"]


async def test_refusals_reach_the_mcp_client_as_text_naming_the_fix(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        res = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "nope"})
        assert res.is_error and "profile_list" in res.content[0].text
        res = await c.call_tool("task_get", {"task_id": "tr_missing"})
        assert res.is_error and "does not exist" in res.content[0].text
        res = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted", "runtime": "ghost"})
        assert res.is_error and "registered runtimes" in res.content[0].text


async def test_tool_schemas_are_generated_from_typed_models(hub):
    async with mcp_client(hub.url, hub.admin_token) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert {"profile_list", "task_submit", "task_run", "task_get", "task_wait", "task_events",
            "task_cancel"} <= set(tools)
    submit = tools["task_submit"].input_schema["properties"]
    assert {"prompt", "profile", "runtime", "model", "extra_args", "timeout_s", "name"} <= set(submit)
    assert set(tools["task_get"].output_schema["properties"]) >= {"task_id", "status", "outcome", "result", "usage",
                                                                  "changed_files", "error"}


async def test_task_wait_timeout_returns_and_never_cancels_the_task(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        sub = (await c.call_tool("task_submit",
                                 {"prompt": "sleep 2.5\nsay late", "profile": "scripted"})).structured_content
        page = (await c.call_tool("task_wait",
                                  {"task_id": sub["task_id"], "cursor": 0, "timeout_s": 0.2})).structured_content
        assert page["timed_out"] and not page["done"] and page["events"] == []
        cursor = 0
        while True:
            page = (await c.call_tool("task_wait",
                                      {"task_id": sub["task_id"], "cursor": cursor, "timeout_s": 5})).structured_content
            cursor = page["cursor"]
            if page["done"]:
                break
        got = (await c.call_tool("task_get", {"task_id": sub["task_id"]})).structured_content
    assert got["status"] == "succeeded" and got["result"]["text"] == "late"
    assert cursor == 1


async def test_task_cancelled_while_running_ends_cancelled(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        sub = (await c.call_tool("task_submit", {"prompt": "say start\nsleep 30\nsay never",
                                                 "profile": "scripted"})).structured_content
        page = (await c.call_tool("task_wait", {"task_id": sub["task_id"], "timeout_s": 10})).structured_content
        assert page["events"][0]["text"] == "start"
        await c.call_tool("task_cancel", {"task_id": sub["task_id"]})
        got = (await c.call_tool("task_run", {"prompt": "say after", "profile": "scripted"})).structured_content
        final = (await c.call_tool("task_get", {"task_id": sub["task_id"]})).structured_content
    assert final["status"] == "cancelled" and got["status"] == "succeeded"


async def test_task_cancelled_while_queued_ends_cancelled(hub):
    await hub.start_runner(slots=1)
    async with mcp_client(hub.url, hub.admin_token) as c:
        busy = (await c.call_tool("task_submit", {"prompt": "sleep 30", "profile": "scripted"})).structured_content
        queued = (await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted"})).structured_content
        ans = (await c.call_tool("task_cancel", {"task_id": queued["task_id"]})).structured_content
        await c.call_tool("task_cancel", {"task_id": busy["task_id"]})
    assert ans["status"] == "cancelled"


async def test_a_structured_question_fails_the_task_with_a_bilingual_diagnostic(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        t = (await c.call_tool("task_run", {"prompt": "ask 'which branch?'", "profile": "scripted"})).structured_content
    assert t["status"] == "failed" and "interactive session" in t["error"] and "交互式会话" in t["error"]


async def test_scripted_engine_as_a_real_subprocess_emits_the_same_events(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        a = (await c.call_tool("task_run", {"prompt": SCRIPT, "profile": "scripted"})).structured_content
        b = (await c.call_tool("task_run", {"prompt": SCRIPT, "profile": "scripted",
                                            "extra_args": ["--subprocess"]})).structured_content
        ea = (await c.call_tool("task_events", {"task_id": a["task_id"]})).structured_content["events"]
        eb = (await c.call_tool("task_events", {"task_id": b["task_id"]})).structured_content["events"]
    strip = lambda evs: [{k: v for k, v in e.items() if k != "at"} for e in evs]  # noqa: E731
    assert strip(ea) == strip(eb) and b["status"] == "succeeded" and b["changed_files"] == a["changed_files"]


async def test_task_timeout_ends_the_run_timed_out(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        t = (await c.call_tool("task_run",
                               {"prompt": "sleep 5", "profile": "scripted", "timeout_s": 0.3})).structured_content
    assert t["status"] == "timed_out"


async def test_failing_script_ends_failed_with_its_reason(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        t = (await c.call_tool("task_run",
                               {"prompt": "say partial\nfail disk full", "profile": "scripted"})).structured_content
    assert t["status"] == "failed" and t["error"] == "disk full" and t["result"]["text"] == "partial"
