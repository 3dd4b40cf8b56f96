"""escalate-to-main end to end: a task's engine asks permission, the caller answers with permission_respond over MCP
and over REST, and the run continues; an answer to a request that no longer waits is refused naming the tool that
shows what happened, and changes nothing."""
from __future__ import annotations

import httpx2

from tests.helpers import mcp_client

SCRIPT = """say start
permission Bash 'rm -rf build'
say after bash
permission Write 'write notes.txt'
say done"""


async def ok(c, tool, **args):
    res = await c.call_tool(tool, args)
    assert not res.is_error, res.content[0].text
    return res.structured_content


async def refused(c, tool, **args) -> str:
    res = await c.call_tool(tool, args)
    assert res.is_error, res.structured_content
    return res.content[0].text


async def next_permission(c, task_id: str, cursor: int) -> tuple[dict, int]:
    """Wait (task_wait) until the task asks permission; return that event and the cursor after it."""
    while True:
        page = await ok(c, "task_wait", task_id=task_id, cursor=cursor, timeout_s=20)
        assert not page["done"], page
        for ev in page["events"]:
            if ev["type"] == "permission":
                return ev, ev["seq"]
        cursor = page["cursor"]


async def rest_answer(hub, token: str, task_id: str, body: dict) -> httpx2.Response:
    async with httpx2.AsyncClient() as http:
        return await http.post(f"{hub.url}/api/v1/tasks/{task_id}/permission", json=body,
                               headers={"Authorization": f"Bearer {token}"})


async def test_an_escalated_task_continues_after_answers_over_mcp_and_rest(any_hub):
    hub = any_hub
    await hub.start_runner()
    token = await hub.token("alice")
    async with mcp_client(hub.url, token) as c:
        task_id = (await ok(c, "task_submit", prompt=SCRIPT, profile="scripted",
                            permission_policy="escalate-to-main"))["task_id"]
        first, cursor = await next_permission(c, task_id, 0)
        assert (first["request_id"], first["tool"], first["title"]) == ("perm_1_Bash", "Bash", "rm -rf build")
        answered = await ok(c, "permission_respond", task_id=task_id, request_id=first["request_id"], allow=True)
        assert answered == {"task_id": task_id, "request_id": "perm_1_Bash", "allow": True, "status": "sent",
                            "attempt": 1}  # the attempt that asked
        second, cursor = await next_permission(c, task_id, cursor)
        assert second["request_id"] == "perm_2_Write"
        # the first request was answered: answering it again is refused while the task runs, and nothing is sent
        before = (await ok(c, "task_events", task_id=task_id))["events"]
        text = await refused(c, "permission_respond", task_id=task_id, request_id="perm_1_Bash", allow=False)
        assert "already answered (allow) and no longer waits" in text and "task_events" in text
        assert (await ok(c, "task_events", task_id=task_id))["events"] == before
        resp = await rest_answer(hub, token, task_id, {"request_id": "perm_2_Write", "allow": True, "message": "ok"})
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"task_id": task_id, "request_id": "perm_2_Write", "allow": True, "status": "sent",
                               "attempt": 1}
        while not (page := await ok(c, "task_wait", task_id=task_id, cursor=cursor, timeout_s=20))["done"]:
            cursor = page["cursor"]
        view = await ok(c, "task_get", task_id=task_id)
        assert view["status"] == "succeeded", view
        assert view["result"]["text"] == "start\nafter bash\ndone"
        events = (await ok(c, "task_events", task_id=task_id))["events"]
        assert [(e["request_id"], e["allow"]) for e in events if e["type"] == "permission_answer"] == [
            ("perm_1_Bash", True), ("perm_2_Write", True)]
        # the task has ended: no request of it waits any more
        text = await refused(c, "permission_respond", task_id=task_id, request_id="perm_2_Write", allow=True)
        assert "has ended" in text and "task_get" in text
        resp = await rest_answer(hub, token, task_id, {"request_id": "perm_1_Bash", "allow": True})
        assert resp.status_code == 409 and "task_get" in resp.json()["fix"]
        assert (await ok(c, "task_events", task_id=task_id))["events"] == events


async def test_a_denied_request_fails_the_run_with_the_callers_message_and_an_unknown_one_names_task_events(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        task_id = (await ok(c, "task_submit", prompt=SCRIPT, profile="scripted",
                            permission_policy="escalate-to-main"))["task_id"]
        first, cursor = await next_permission(c, task_id, 0)
        text = await refused(c, "permission_respond", task_id=task_id, request_id="perm_9_Nope", allow=True)
        assert "perm_1_Bash" in text and "task_events" in text
        await ok(c, "permission_respond", task_id=task_id, request_id=first["request_id"], allow=False,
                 message="not on this branch")
        while not (page := await ok(c, "task_wait", task_id=task_id, cursor=cursor, timeout_s=20))["done"]:
            cursor = page["cursor"]
        view = await ok(c, "task_get", task_id=task_id)
    assert view["status"] == "failed" and view["error"] == "permission for Bash denied: not on this branch"
    assert view["result"]["text"] == "start"


async def test_a_task_under_policy_allow_asks_nothing_and_an_answer_to_it_names_its_policy(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        view = await ok(c, "task_run", prompt=SCRIPT, profile="scripted")
        assert view["status"] == "succeeded" and view["result"]["text"] == "start\nafter bash\ndone"
        text = await refused(c, "permission_respond", task_id=view["task_id"], request_id="perm_1_Bash", allow=True)
    assert "policy-allow" in text and "escalate-to-main" in text
