"""Issue 33 item 4 over real HTTP: a run token reaches the same things on every door, OAuth grants die with the
amux token that approved them, runner tokens stay off argv, and a runtime name stays with the token that
registered it."""
from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx2
import pytest
import sqlalchemy as sa

from hub.engines.scripted import ScriptedEngine
from hub.runner.agent import Runner, RunnerRefused
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import api_tokens, runtimes
from tests.helpers import REPO, eventually, mcp_client, runner_command, started
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
        boxes = await c.call_tool("rift_task_new", {"name": "escape"})  # the fix named is a token, not a scope
        assert boxes.is_error and "memory and coordination" in boxes.content[0].text
        for tool in ("session_list", "schedule_list", "profile_list"):  # what REST lets it do, MCP does too
            assert not (await c.call_tool(tool, {})).is_error, tool
    async with mcp_client(hub.url, await hub.token("bob")) as c:  # a user token is untouched
        assert not (await c.call_tool("instance_create", {"profile": "scripted"})).is_error


async def test_a_run_token_cannot_open_the_boxes_page_which_shows_leases_it_cannot_reach_elsewhere(hub):
    token = await run_token(hub)
    async with httpx2.AsyncClient() as http:
        page = await http.get(f"{hub.url}/boxes", headers={"Authorization": f"Bearer {token}"})
        assert page.status_code == 401 and "memory and coordination" in page.text
        mine = await http.get(f"{hub.url}/boxes", headers={"Authorization": f"Bearer {await hub.token('alice')}"})
        assert mine.status_code == 200


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
    hub.hub.oauth._verified.clear()  # what another replica's cache holds is its own 5 s
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


# ---------------------------------------------------------------- runner tokens: where they come from, what they bind


async def runtime_row(hub, name: str):
    async with hub.hub.db.read() as conn:
        return (await conn.execute(sa.select(runtimes).where(runtimes.c.name == name))).first()


async def test_a_runner_reads_its_token_from_token_file_and_a_token_on_argv_logs_a_warning(hub, tmp_path):
    token = await hub.hub.auth.create_token("ops", admin=True, runner=True)
    argv = runner_command(hub.url, token, "from-file", 1, tmp_path / "ws")
    assert token not in argv
    quiet = await asyncio.create_subprocess_exec(*argv, cwd=REPO, env={**os.environ, "AMUX_HOME": str(tmp_path)},
                                                 stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    loud = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", "runner", "--hub", hub.url, "--token", token, "--name", "from-argv",
        "--workspace-root", str(tmp_path / "ws2"), cwd=REPO, env={**os.environ, "AMUX_HOME": str(tmp_path)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        warning = (await started(loud.stderr.readline(), "the runner's first log line")).decode()
        assert " WARNING " in warning and "`ps` shows it to every local user" in warning
        assert "--token-file" in warning and "AMUX_TOKEN" in warning
        for name in ("from-file", "from-argv"):
            await started(lambda: _online(hub, name), f"runner {name} online")
    finally:
        for proc in (quiet, loud):
            proc.terminate()
        _, quiet_err = await quiet.communicate()
        await loud.wait()
    assert "shows it to every local user" not in quiet_err.decode()  # (its dedicated-runner warning is another)
    empty = tmp_path / "empty.token"
    empty.write_text("")
    code, _, err = await amux("runner", "--hub", hub.url, "--token-file", str(empty), env={})
    assert code == 2 and "is empty" in err and "amux token create" in err


async def _online(hub, name: str) -> bool:
    row = await runtime_row(hub, name)
    return row is not None and row.status == "online"


def in_process_runner(hub, token: str, name: str) -> Runner:
    return Runner(hub.url, token, name=name, slots=1, workspace_root=Path(hub.hub.settings.home) / "ws" / name,
                  engines={"scripted": ScriptedEngine()})


async def test_a_runtime_name_stays_with_the_runner_token_that_registered_it_until_it_is_freed(hub):
    first = await hub.hub.auth.create_token("ops", admin=True, runner=True)
    second = await hub.hub.auth.create_token("ops", admin=True, runner=True)  # same principal, another machine
    runner = await hub.start_runner(name="pool", token=first)
    bound = (await runtime_row(hub, "pool")).connection_id
    with pytest.raises(RunnerRefused, match="bound to the runner token.*amux runtime deregister pool"):
        await asyncio.wait_for(in_process_runner(hub, second, "pool").run_forever(), 10)
    row = await runtime_row(hub, "pool")
    assert row.connection_id == bound and row.token_id == "tok_" + first.split(".")[1]
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sub = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="say still mine", profile="scripted"))
    assert (await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=20))["status"] == "succeeded"
    await runner.stop()  # the same token reconnecting is the same runner
    await eventually(lambda: _is_offline(hub, "pool"))
    again = await hub.start_runner(name="pool", token=first)
    await again.stop()
    await eventually(lambda: _is_offline(hub, "pool"))
    # The operator frees the name; then another token may take it.
    code, out, err = await amux("runtime", "deregister", "pool", env={"AMUX_HUB_URL": hub.url,
                                                                       "AMUX_TOKEN": hub.admin_token})
    assert code == 0 and "pool: deregistered" in out, err
    await hub.start_runner(name="pool", token=second)
    assert (await runtime_row(hub, "pool")).token_id == "tok_" + second.split(".")[1]


async def test_a_revoked_runner_tokens_runtime_goes_to_the_owners_new_token(hub):
    old = await hub.hub.auth.create_token("ops", admin=True, runner=True)
    runner = await hub.start_runner(name="rotated", token=old)
    status, _ = await call(hub, "DELETE", f"tokens/tok_{old.split('.')[1]}", hub.admin_token)
    assert status == 200
    with pytest.raises(RunnerRefused):
        await asyncio.wait_for(hub.runners[-1][1], 10)
    await runner.stop()
    await eventually(lambda: _is_offline(hub, "rotated"))
    new = await hub.hub.auth.create_token("ops", admin=True, runner=True)
    await hub.start_runner(name="rotated", token=new)
    thief = await hub.hub.auth.create_token("mallory", runner=True)  # another principal: still refused
    with pytest.raises(RunnerRefused, match="belongs to 'ops'"):
        await asyncio.wait_for(in_process_runner(hub, thief, "rotated").run_forever(), 10)


async def _is_offline(hub, name: str) -> bool:
    row = await runtime_row(hub, name)
    return row is not None and row.status != "online"


async def test_amux_up_with_a_new_runner_token_file_keeps_its_in_process_runtime(tmp_path):
    from tests.integration.test_cli_discovery import Up

    home = tmp_path / "home"

    async def local_status(url: str) -> str | None:
        admin = (home / "admin.token").read_text().strip()
        status, body = await call(SimpleNamespace(url=url), "GET", "runtimes", admin)
        return next((r["status"] for r in body["runtimes"] if r["name"].startswith("local-")), None)

    first = Up(home, tmp_path)
    try:
        await started(lambda: _equals(local_status(first.url), "online"), "the in-process runner online")
    finally:
        first.stop()
    (home / "runner.token").unlink()  # a new token is minted: it replaces the old one, which held the name
    second = Up(home, tmp_path)
    try:
        await started(lambda: _equals(local_status(second.url), "online"), "the in-process runner online")
    finally:
        second.stop()


async def _equals(coro, value) -> bool:
    return (await coro) == value
