"""Sessions are first class for agents: session_* over the official MCP client, REST `GET /api/v1/sessions`, and a
session-prompt schedule that falls back to the caller's own `amux-session:<id>` session."""
from __future__ import annotations

import httpx2
import sqlalchemy as sa

from hub.store.tables import schedules, sessions
from tests.helpers import mcp_client, turn_child_env


async def ok(c, tool, **args):
    res = await c.call_tool(tool, args)
    assert not res.is_error, res.content[0].text
    return res.structured_content


async def refused(c, tool, **args) -> str:
    res = await c.call_tool(tool, args)
    assert res.is_error, res.structured_content
    return res.content[0].text


async def user(hub, name: str):
    """A user's token and its Caller."""
    token = await hub.token(name)
    return token, await hub.hub.auth.authenticate(token)


async def session_token(hub, caller, session_id: str) -> str:
    """The `amux-session:<id>` token a run in that session carries (AMUX_TOKEN of the child)."""
    async with hub.hub.db.write() as conn:
        return (await turn_child_env(hub.hub, conn, caller.principal_id, session_id))["AMUX_TOKEN"]


async def turns_of(hub, session_id: str) -> int:
    async with hub.hub.db.read() as conn:
        return (await conn.execute(sa.select(sessions.c.turns).where(sessions.c.id == session_id))).scalar()


async def test_session_list_shows_only_the_callers_sessions_newest_first_and_names_the_tokens_own(hub):
    await hub.start_runner()
    alice_token, alice = await user(hub, "alice")
    _, bob = await user(hub, "bob")
    first = (await hub.hub.sessions.create(alice, name="first", profile="scripted"))["session_id"]
    hub.clock.advance(5)
    second = (await hub.hub.sessions.create(alice, name="second", profile="scripted"))["session_id"]
    await hub.hub.sessions.create(bob, name="bobs", profile="scripted")
    async with mcp_client(hub.url, alice_token) as c:
        mine = await ok(c, "session_list")
    async with mcp_client(hub.url, await session_token(hub, alice, first)) as agent:
        inside = await ok(agent, "session_list", limit=1)
    assert [s["session_id"] for s in mine["sessions"]] == [second, first] and mine["current_session_id"] is None
    assert mine["sessions"][0]["name"] == "second" and mine["sessions"][0]["engine"] == "scripted"
    assert mine["sessions"][0]["kind"] == "interactive" and mine["sessions"][0]["turns"] == 0
    assert [s["session_id"] for s in inside["sessions"]] == [second] and inside["current_session_id"] == first


async def test_session_get_reads_by_id_or_name_and_an_agent_omits_it_for_its_own_session(hub):
    await hub.start_runner()
    alice_token, alice = await user(hub, "alice")
    sid = (await hub.hub.sessions.create(alice, name="desk", profile="scripted"))["session_id"]
    await hub.hub.sessions.wait_turn(alice, await hub.hub.sessions.submit_turn(alice, sid, "say hello"), 10)
    async with mcp_client(hub.url, alice_token) as c:
        by_name = await ok(c, "session_get", session_ref="desk")
        by_id = await ok(c, "session_get", session_ref=sid)
        assert "session_list" in await refused(c, "session_get")  # a plain token has no session of its own
    async with mcp_client(hub.url, await session_token(hub, alice, sid)) as agent:
        own = await ok(agent, "session_get")
    assert by_name["session_id"] == by_id["session_id"] == own["session_id"] == sid
    assert [(t["seq"], t["kind"], t["status"], t["result"]) for t in own["turns"]] == [
        (1, "turn", "succeeded", "hello")]


async def test_session_send_queues_a_turn_and_with_wait_returns_its_outcome(hub):
    await hub.start_runner()
    alice_token, alice = await user(hub, "alice")
    sid = (await hub.hub.sessions.create(alice, name="desk", profile="scripted"))["session_id"]
    async with mcp_client(hub.url, alice_token) as c:
        queued = await ok(c, "session_send", session_ref="desk", text="say queued")
        done = await ok(c, "session_send", session_ref=sid, text="say waited", wait=True, timeout_s=20)
        first = await hub.hub.sessions.wait_turn(alice, queued["turn_id"], 10)
    assert queued["status"] == "queued" and queued["session_id"] == sid and queued["turn_id"].startswith("turn_")
    assert done["status"] == "succeeded" and done["result"]["text"] == "waited" and done["session_id"] == sid
    assert first["result"]["text"] == "queued" and await turns_of(hub, sid) == 2


async def test_session_send_to_another_users_session_is_refused_naming_session_list_and_changes_nothing(hub):
    await hub.start_runner()
    alice_token, _ = await user(hub, "alice")
    _, bob = await user(hub, "bob")
    bobs = (await hub.hub.sessions.create(bob, name="bobs", profile="scripted"))["session_id"]
    async with mcp_client(hub.url, alice_token) as c:
        by_id = await refused(c, "session_send", session_ref=bobs, text="say intruding")
        by_name = await refused(c, "session_send", session_ref="bobs", text="say intruding")
        assert "session_list" in await refused(c, "session_get", session_ref=bobs)
    async with mcp_client(hub.url, hub.admin_token) as admin:
        as_admin = await refused(admin, "session_send", session_ref=bobs, text="say intruding")
        read = await ok(admin, "session_get", session_ref=bobs)  # an admin reads any session, as with task_get
    assert all("session_list" in t and "another user" in t for t in (by_id, by_name, as_admin))
    assert read["session_id"] == bobs and read["turns"] == []
    assert await turns_of(hub, bobs) == 0


async def test_a_session_prompt_schedule_over_mcp_without_a_session_ref_goes_into_the_callers_own_session(hub):
    await hub.start_runner()
    _, alice = await user(hub, "alice")
    sid = (await hub.hub.sessions.create(alice, name="desk", profile="scripted"))["session_id"]
    async with mcp_client(hub.url, await session_token(hub, alice, sid)) as agent:
        made = await ok(agent, "schedule_create", prompt="say tick", rule="every 1h", schedule_type="session-prompt")
        named = await ok(agent, "schedule_create", prompt="say tock", rule="every 1h", schedule_type="session-prompt",
                         session_ref="desk")
    assert made["schedule_type"] == "session-prompt" and made["session_ref"] == sid == named["session_ref"]


async def test_a_session_prompt_schedule_without_a_session_ref_or_an_own_session_is_refused_naming_session_list(hub):
    alice_token, _ = await user(hub, "alice")
    async with mcp_client(hub.url, alice_token) as c:
        text = await refused(c, "schedule_create", prompt="say tick", rule="every 1h", schedule_type="session-prompt")
        listed = await ok(c, "schedule_list")
    assert "session_list" in text and "session_ref" in text and listed["schedules"] == []
    async with hub.hub.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(schedules))).scalar() == 0


async def test_rest_lists_only_the_callers_sessions_and_refuses_a_turn_into_another_users_naming_session_list(hub):
    await hub.start_runner()
    alice_token, alice = await user(hub, "alice")
    _, bob = await user(hub, "bob")
    mine = (await hub.hub.sessions.create(alice, name="desk", profile="scripted"))["session_id"]
    bobs = (await hub.hub.sessions.create(bob, profile="scripted"))["session_id"]
    async with httpx2.AsyncClient(base_url=f"{hub.url}/api/v1", timeout=10,
                                  headers={"Authorization": f"Bearer {alice_token}"}) as http:
        listed = await http.get("/sessions", params={"limit": 10})
        sent = await http.post(f"/sessions/{bobs}/turns", json={"text": "say intruding"})
    assert listed.status_code == 200 and [s["session_id"] for s in listed.json()["sessions"]] == [mine]
    assert sent.status_code == 404 and "session_list" in sent.json()["fix"]
    assert await turns_of(hub, bobs) == 0
