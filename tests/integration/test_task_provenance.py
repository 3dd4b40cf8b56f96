"""Provenance is readable: task_get (MCP, REST) and `amux task get` name the Session and Turn that delegated a task,
the instance it is a run of, and the schedule firing that created it."""
from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx2
import sqlalchemy as sa

from hub.store.tables import task_runs
from tests.helpers import REPO, eventually, mcp_client, turn_child_env

PROVENANCE = ("parent_session_id", "parent_turn_id", "instance_id", "schedule_id", "firing_id")


async def ok(c, tool, **args):
    res = await c.call_tool(tool, args)
    assert not res.is_error, res.content[0].text
    return res.structured_content


async def rest_get(hub, token: str, task_id: str) -> dict:
    async with httpx2.AsyncClient() as http:
        resp = await http.get(f"{hub.url}/api/v1/tasks/{task_id}", headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 200, resp.text
    return resp.json()


async def cli_get(hub, token: str, task_id: str, *flags: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", "task", "get", task_id, *flags, cwd=REPO,
        env={**os.environ, "AMUX_HUB_URL": hub.url, "AMUX_TOKEN": token},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def running(hub, run_id: str) -> bool:
    async with hub.hub.db.read() as conn:
        return (await conn.execute(sa.select(task_runs.c.status).where(task_runs.c.id == run_id))).scalar() == "running"


async def test_a_task_a_session_turn_delegated_names_that_session_and_turn_over_mcp_rest_and_the_cli(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sid = (await hub.hub.sessions.create(admin, profile="scripted"))["session_id"]
    turn = await hub.hub.sessions.submit_turn(admin, sid, "wait-steer 20")
    await eventually(lambda: running(hub, turn))
    async with hub.hub.db.write() as conn:  # the token that Turn's child holds (AMUX_TOKEN)
        child_token = (await turn_child_env(hub.hub, conn, admin.principal_id, sid))["AMUX_TOKEN"]
    async with mcp_client(hub.url, child_token) as c:
        task_id = (await ok(c, "task_submit", prompt="say delegated", profile="scripted"))["task_id"]
        view = await ok(c, "task_get", task_id=task_id)
    assert (view["parent_session_id"], view["parent_turn_id"]) == (sid, turn)
    assert view["instance_id"] is None and view["schedule_id"] is None and view["firing_id"] is None
    rest = await rest_get(hub, hub.admin_token, task_id)
    assert {k: rest[k] for k in PROVENANCE} == {k: view[k] for k in PROVENANCE}
    assert json.loads(await cli_get(hub, hub.admin_token, task_id, "--json"))["parent_turn_id"] == turn
    assert f"from: session {sid}, turn {turn}" in await cli_get(hub, hub.admin_token, task_id)
    await hub.hub.tasks.cancel(admin, turn)


async def test_a_task_a_schedule_firing_created_names_the_schedule_and_that_firing(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        sched = await ok(c, "schedule_create", prompt="say scheduled", rule="every 5m", profile="scripted")
        hub.clock.advance(301)
        await hub.hub.schedule_firing.fire_due()  # or the hub's own firing loop got there first

        async def fired() -> list:
            return [f for f in (await ok(c, "schedule_history", schedule_id=sched["schedule_id"]))["firings"]
                    if f["task_id"]]

        [firing] = await eventually(fired)
        view = await ok(c, "task_get", task_id=firing["task_id"])
    assert (view["schedule_id"], view["firing_id"]) == (sched["schedule_id"], firing["firing_id"])
    assert view["parent_session_id"] is None and view["parent_turn_id"] is None and view["instance_id"] is None
    rest = await rest_get(hub, hub.admin_token, firing["task_id"])
    assert (rest["schedule_id"], rest["firing_id"]) == (sched["schedule_id"], firing["firing_id"])
    text = await cli_get(hub, hub.admin_token, firing["task_id"])
    assert f"from: schedule {sched['schedule_id']}, firing {firing['firing_id']}" in text


async def test_an_instance_run_names_its_instance_and_a_plain_task_names_nothing(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        inst = await ok(c, "instance_create", profile="scripted", prompt="say first run")
        run = await ok(c, "task_get", task_id=inst["task_id"])
        plain = (await ok(c, "task_submit", prompt="say plain", profile="scripted"))["task_id"]
        alone = await ok(c, "task_get", task_id=plain)
    assert run["instance_id"] == inst["instance_id"] and run["parent_session_id"] is None
    assert all(alone[k] is None for k in PROVENANCE), alone
    assert (await rest_get(hub, hub.admin_token, inst["task_id"]))["instance_id"] == inst["instance_id"]
    assert f"from: instance {inst['instance_id']}" in await cli_get(hub, hub.admin_token, inst["task_id"])
    assert "from:" not in await cli_get(hub, hub.admin_token, plain)


async def test_the_task_get_output_schemas_name_every_provenance_field(hub):
    async with mcp_client(hub.url, hub.admin_token) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    props = tools["task_get"].output_schema["properties"]
    assert set(PROVENANCE) <= set(props) and all(props[k].get("description") for k in PROVENANCE)
    async with httpx2.AsyncClient() as http:
        spec = (await http.get(f"{hub.url}/api/v1/openapi.json")).json()
    ref = spec["paths"]["/api/v1/tasks/{id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    schema = spec["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]
    assert set(PROVENANCE) <= set(schema["required"]) and all(schema["properties"][k].get("description")
                                                               for k in PROVENANCE)
