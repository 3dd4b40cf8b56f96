"""Token routes, the `amux token` commands, and revocation cutting off a live runner (real hub, real sockets)."""
from __future__ import annotations

import asyncio
import json
import os
import sys

import aiohttp
import pytest

from hub.runner.agent import RunnerRefused
import sqlalchemy as sa

from hub.services.tasks.service import SubmitRequest
from hub.store.tables import api_tokens, reservations, runtimes, task_runs
from tests.helpers import REPO, eventually, mcp_client, turn_child_env


async def call(hub, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        async with http.request(method, f"{hub.url}/api/v1/{path}", json=body) as r:
            return r.status, await r.json(content_type=None)


async def runtime_status(hub, name: str):
    async with hub.hub.db.read() as conn:
        return (await conn.execute(sa.select(runtimes.c.status).where(runtimes.c.name == name))).scalar()


@pytest.mark.parametrize("how", ["rest", "database"])
async def test_a_revoked_runners_socket_is_closed_and_it_receives_no_dispatch(hub, how):
    token = await hub.hub.auth.create_token("ops", admin=True, runner=True)
    runner = await hub.start_runner(name="pool", token=token)
    task = hub.runners[-1][1]
    token_id = "tok_" + token.split(".")[1]
    if how == "rest":  # this replica: the socket closes at once
        status, body = await call(hub, "DELETE", f"tokens/{token_id}", hub.admin_token)
        assert status == 200 and body["revoked"], body
    else:  # another replica revoked it: this one sees it in the database on its next pump round
        async with hub.hub.db.write() as conn:
            await conn.execute(api_tokens.update().where(api_tokens.c.id == token_id)
                               .values(revoked_at=hub.clock.now()))
    with pytest.raises(RunnerRefused, match="revoked"):
        await asyncio.wait_for(task, 5)
    assert runner.ws is None
    await eventually(lambda: _is(runtime_status(hub, "pool"), "offline"))
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sub = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="say hi", profile="scripted"))
    await asyncio.sleep(0.5)
    assert (await hub.hub.tasks.get(admin, sub["task_id"]))["status"] == "queued"
    async with hub.hub.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(reservations))).scalar() == 0


async def _is(coro, value):
    return (await coro) == value


async def test_token_routes_show_your_tokens_and_an_admin_sees_all_never_a_hash(hub):
    status, made = await call(hub, "POST", "tokens", hub.admin_token, {"principal": "alice", "label": "laptop"})
    assert status == 201 and made["kind"] == "user"
    alice = made["token"]
    status, mine = await call(hub, "GET", "tokens", alice)
    assert status == 200 and [t["label"] for t in mine["tokens"]] == ["laptop"]
    assert set(mine["tokens"][0]) >= {"id", "kind", "label", "created", "last_used", "revoked"}
    assert "hash" not in json.dumps(mine) and made["token"].split(".")[2] not in json.dumps(mine)
    assert (await call(hub, "GET", "tokens?all=1", alice))[0] == 403
    status, everyone = await call(hub, "GET", "tokens?all=1", hub.admin_token)
    assert {t["principal"] for t in everyone["tokens"]} >= {"admin", "alice"}
    admin_id = [t["id"] for t in everyone["tokens"] if t["principal"] == "admin"][0]
    assert (await call(hub, "DELETE", f"tokens/{admin_id}", alice))[0] == 404
    status, runner = await call(hub, "POST", "tokens", alice, {"runner": True})
    assert status == 201 and runner["kind"] == "runner" and runner["shared"] is False
    status, body = await call(hub, "GET", "tasks", runner["token"])
    assert status == 403 and "runner token" in body["message"]
    assert (await call(hub, "POST", "tokens", alice, {"admin": True}))[0] == 403
    assert (await call(hub, "DELETE", f"tokens/{made['id']}", alice))[0] == 200
    assert (await call(hub, "GET", "tokens", alice))[0] == 401


async def test_a_run_token_is_refused_outside_memory_and_coordination_calls(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sid = (await hub.hub.sessions.create(admin, profile="scripted"))["session_id"]
    turn = await hub.hub.sessions.submit_turn(admin, sid, "wait-steer 20")
    await eventually(lambda: _is(_status(hub, admin, turn), "running"))
    async with hub.hub.db.write() as conn:
        token = (await turn_child_env(hub.hub, conn, admin.principal_id, sid))["AMUX_TOKEN"]
    for method, path in (("GET", "tokens"), ("GET", "runtimes"), ("GET", "credentials"), ("POST", "profiles")):
        status, body = await call(hub, method, path, token)
        assert status == 403 and "memory and coordination" in body["message"], (path, body)
    assert (await call(hub, "GET", "tasks", token))[0] == 200
    assert (await call(hub, "GET", f"sessions/{sid}", token))[0] == 200
    async with mcp_client(hub.url, token) as mcp:
        assert not (await mcp.call_tool("task_submit", {"prompt": "say delegated", "profile": "scripted"})).is_error
        assert (await mcp.call_tool("rift_task_new", {"name": "escape"})).is_error  # boxes are no coordination
    await hub.hub.tasks.cancel(admin, turn)
    await eventually(lambda: _is(_status(hub, admin, turn), "cancelled"))
    assert (await call(hub, "GET", "tasks", token))[0] == 401  # ended with its run


async def _status(hub, _admin, run_id):
    async with hub.hub.db.read() as conn:
        return (await conn.execute(sa.select(task_runs.c.status).where(task_runs.c.id == run_id))).scalar()


async def amux(*args: str, env: dict) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "hub.cli", *args, cwd=REPO,
                                                env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


async def test_amux_token_list_and_revoke(hub):
    alice = await hub.hub.auth.create_token("alice", label="cli")
    env = {"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}
    code, out, err = await amux("token", "list", "--all", "--json", env=env)
    assert code == 0, err
    alice_id = [t["id"] for t in json.loads(out)["tokens"] if t["principal"] == "alice"][0]
    code, out, err = await amux("token", "revoke", alice_id, env=env)
    assert code == 0 and f"{alice_id}: revoked" in out, err
    code, out, err = await amux("token", "list", env={"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": alice})
    assert code == 3 and "invalid or revoked" in err
