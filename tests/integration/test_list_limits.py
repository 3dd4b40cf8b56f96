"""An honest list: a `limit` above what one answer holds is refused naming the maximum, never cut short in silence."""
from __future__ import annotations

import httpx2

from hub.domain.pages import MAX_SCHEDULES, MAX_SESSIONS, MAX_TASKS, MAX_TURNS
from tests.helpers import mcp_client


async def test_rest_lists_refuse_a_limit_above_their_maximum_with_a_400_naming_it_on_both_stores(any_hub):
    headers = {"Authorization": f"Bearer {any_hub.admin_token}"}
    async with httpx2.AsyncClient(timeout=10, headers=headers) as http:
        for area, maximum in (("tasks", MAX_TASKS), ("sessions", MAX_SESSIONS), ("schedules", MAX_SCHEDULES)):
            for bad in (maximum + 1, 0):
                resp = await http.get(f"{any_hub.url}/api/v1/{area}", params={"limit": bad})
                body = resp.json()
                assert resp.status_code == 400, (area, bad, resp.text)
                assert set(body) >= {"error", "fix", "request_id"} and f"from 1 to {maximum}" in body["fix"], body
            ok = await http.get(f"{any_hub.url}/api/v1/{area}", params={"limit": maximum})
            assert ok.status_code == 200, (area, ok.text)
        spec = (await http.get(f"{any_hub.url}/api/v1/openapi.json")).json()
    limit = next(p for p in spec["paths"]["/api/v1/tasks"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"]["maximum"] == MAX_TASKS and limit["schema"]["minimum"] == 1, limit


async def test_mcp_lists_refuse_a_limit_above_their_maximum_naming_it(hub):
    async with mcp_client(hub.url, hub.admin_token) as c:
        for tool, maximum in (("session_list", MAX_SESSIONS), ("schedule_list", MAX_SCHEDULES)):
            res = await c.call_tool(tool, {"limit": maximum + 1})
            assert res.is_error, (tool, res.structured_content)
            assert f"limit {maximum + 1} is above the maximum of {maximum}" in res.content[0].text, res.content
            assert f"ask for at most {maximum}" in res.content[0].text
            assert not (await c.call_tool(tool, {"limit": maximum})).is_error
        res = await c.call_tool("session_get", {"session_ref": "nope", "turns": MAX_TURNS + 1})
        assert res.is_error and f"turns {MAX_TURNS + 1} is above the maximum of {MAX_TURNS}" in res.content[0].text
