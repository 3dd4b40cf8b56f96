"""Issue 33 item 4 over real HTTP: a run token reaches the same things on every door, and OAuth grants die with
the amux token that approved them."""
from __future__ import annotations

import re

import httpx2

from hub.services.tasks import SubmitRequest
from hub.store.tables import api_tokens
from tests.helpers import mcp_client
from tests.integration.test_oauth import (approve, authorize_url, bearer_client, mcp_status, pkce, register, signed_in,
                                          token_request)
from tests.integration.test_token_lifecycle import amux, call


async def run_token(hub, principal: str = "alice") -> str:
    """Return the run token of a live task run of `principal` (queued: its runtime's runner has stopped)."""
    await (await hub.start_runner()).stop()
    caller = await hub.hub.auth.authenticate(await hub.token(principal))
    task_id = (await hub.hub.tasks.submit(caller, SubmitRequest(prompt="say hi", profile="scripted")))["task_id"]
    async with hub.hub.db.write() as conn:
        return await hub.hub.auth.mint_run(conn, caller.principal_id, task_id, f"amux-task:{task_id}")


async def test_a_run_token_cannot_approve_an_oauth_client_so_no_grant_outlives_its_run(hub):
    token = await run_token(hub)
    async with httpx2.AsyncClient() as http:
        client = await register(http, hub.url)
        _, challenge = pkce()
        resp = await approve(http, authorize_url(hub.url, client, challenge), token)
    assert resp.status_code == 401 and "location" not in resp.headers
    assert "cannot approve an MCP client" in resp.text and "amux token create" in resp.text
    assert not re.search(r"[?&]code=", resp.text)


async def test_a_run_token_is_refused_instance_tools_over_mcp_as_over_rest_and_keeps_coordination(hub):
    token = await run_token(hub)
    status, body = await call(hub, "POST", "instances", token, {"profile": "scripted"})
    assert status == 403 and "memory and coordination" in body["message"], body
    async with mcp_client(hub.url, token) as c:
        refused = await c.call_tool("instance_create", {"profile": "scripted"})
        assert refused.is_error
        text = refused.content[0].text
        assert text.startswith("instance_create:") and "memory and coordination" in text and "amux token create" in text
        assert (await c.call_tool("instance_get", {"instance_id": "inst_x"})).is_error
        for tool in ("session_list", "schedule_list", "profile_list"):  # what REST lets it do, MCP does too
            assert not (await c.call_tool(tool, {})).is_error, tool
    async with mcp_client(hub.url, await hub.token("bob")) as c:  # a user token is untouched
        assert not (await c.call_tool("instance_create", {"profile": "scripted"})).is_error


async def test_revoking_the_approving_token_kills_the_grants_access_and_refresh_tokens(any_hub):
    url = any_hub.url
    status, made = await call(any_hub, "POST", "tokens", any_hub.admin_token, {"principal": "alice"})
    alice, alice_id = made["token"], made["id"]
    other = await any_hub.token("alice", label="other")
    async with httpx2.AsyncClient() as http:
        client, tokens = await signed_in(http, url, alice)
        _, kept = await signed_in(http, url, other)  # approved by another token: lives on
        assert (await mcp_status(url, tokens["access_token"])).status_code == 200
        status, listed = await call(any_hub, "GET", "tokens", alice)
        grants = {g["approved_by"]: g for g in listed["grants"]}
        assert grants[alice_id]["client"] == "Hosted Agent" and grants[alice_id]["scopes"] == ["tasks", "schedules",
                                                                                                "leases"]
        assert (await call(any_hub, "DELETE", f"tokens/{alice_id}", other))[0] == 200
        assert (await mcp_status(url, tokens["access_token"])).status_code == 401
        refreshed = await token_request(http, url, client, grant_type="refresh_token",
                                        refresh_token=tokens["refresh_token"])
        assert refreshed.status_code == 400 and refreshed.json()["error"] == "invalid_grant"
        assert (await mcp_status(url, kept["access_token"])).status_code == 200
        status, listed = await call(any_hub, "GET", "tokens", other)
        assert [g["approved_by"] for g in listed["grants"]] == ["tok_" + other.split(".")[1]]


async def test_a_grant_whose_approving_token_was_revoked_elsewhere_fails_verification(hub):
    alice = await hub.token("alice")
    async with httpx2.AsyncClient() as http:
        client, tokens = await signed_in(http, hub.url, alice)
        async with hub.hub.db.write() as conn:  # another replica revoked it: nothing here revoked the grant
            await conn.execute(api_tokens.update().where(api_tokens.c.id == "tok_" + alice.split(".")[1])
                               .values(revoked_at=hub.clock.now()))
        refreshed = await token_request(http, hub.url, client, grant_type="refresh_token",
                                        refresh_token=tokens["refresh_token"])
        assert refreshed.status_code == 400 and refreshed.json()["error"] == "invalid_grant"
    hub.hub.oauth._verified.clear()  # noqa: SLF001 — what another replica's cache holds is its own 5 s
    assert (await mcp_status(hub.url, tokens["access_token"])).status_code == 401


async def test_amux_token_list_shows_grants_and_amux_token_revoke_revokes_one_by_its_id(hub):
    alice = await hub.token("alice", label="laptop")
    alice_id = "tok_" + alice.split(".")[1]
    async with httpx2.AsyncClient() as http:
        _, tokens = await signed_in(http, hub.url, alice, grant=["tasks", "leases"])
    env = {"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": alice}
    code, out, err = await amux("token", "list", env=env)
    assert code == 0, err
    line = next(x for x in out.splitlines() if " grant " in x)
    grant_id = line.split()[0]
    assert grant_id.startswith("og_") and "Hosted Agent" in line and "scopes tasks leases" in line
    assert f"approved by {alice_id}" in line and "created 20" in line
    code, out, err = await amux("token", "revoke", grant_id, env=env)
    assert code == 0 and f"{grant_id}: revoked" in out, err
    assert (await mcp_status(hub.url, tokens["access_token"])).status_code == 401
    code, out, err = await amux("token", "list", env=env)
    assert code == 0 and " grant " not in out and alice_id in out  # the token itself stays
    code, out, err = await amux("token", "revoke", grant_id, env={**env, "AMUX_TOKEN": await hub.token("bob")})
    assert code != 0 and "not yours" in err
    async with bearer_client(hub.url, alice) as c:  # the amux token still works
        assert not (await c.call_tool("schedule_list", {})).is_error
