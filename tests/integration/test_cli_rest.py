"""The `amux` command line and the REST API it uses."""
from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx2
import sqlalchemy as sa

from hub.store.db import Database
from hub.store.tables import api_tokens
from tests.helpers import REPO


async def amux(*args: str, env: dict | None = None, stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", *args, cwd=REPO, env={**os.environ, **(env or {})},
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate(stdin)
    return proc.returncode, out.decode(), err.decode()


async def test_cli_task_submit_wait_get_and_cancel_with_json(hub):
    await hub.start_runner()
    env = {"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}
    code, out, err = await amux("task", "submit", "--profile", "scripted", "--wait", "--json", "say via cli", env=env)
    assert code == 0, err
    task = json.loads(out)
    assert task["status"] == "succeeded" and task["result"]["text"] == "via cli"
    code, out, _ = await amux("task", "get", task["task_id"], "--json", env=env)
    assert json.loads(out)["outcome"] == "succeeded"
    code, out, _ = await amux("task", "submit", "--profile", "scripted", "--json", "-", env=env, stdin=b"sleep 30")
    tid = json.loads(out)["task_id"]
    code, out, _ = await amux("task", "cancel", tid, "--json", env=env)
    assert code == 0
    code, out, _ = await amux("task", "wait", tid, "--json", env=env)
    assert json.loads(out)["status"] == "cancelled"


async def test_cli_refusal_prints_the_fix_and_exits_3(hub):
    await hub.start_runner()
    env = {"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}
    code, _, err = await amux("task", "submit", "--profile", "nope", "say hi", env=env)
    assert code == 3 and "profile_list" in err
    code, _, err = await amux("task", "get", "tr_x", env={"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": "amux.bad.bad"})
    assert code == 3 and "amux token create" in err


async def test_cli_token_create_shows_the_token_once_and_stores_its_hash(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}"
    code, out, err = await amux("token", "create", "--principal", "carol", "--label", "laptop", "--json", "--db", url,
                                env={"AMUX_HOME": str(tmp_path)})
    assert code == 0, err
    token = json.loads(out)["token"]
    db = Database(url)
    try:
        async with db.read() as conn:
            rows = (await conn.execute(sa.select(api_tokens))).all()
    finally:
        await db.close()
    assert len(rows) == 1 and rows[0].label == "laptop" and token.split(".")[2] not in str(tuple(rows[0]))


async def test_rest_submit_get_events_wait_and_cancel(hub):
    await hub.start_runner()
    headers = {"Authorization": f"Bearer {hub.admin_token}"}
    async with httpx2.AsyncClient(base_url=hub.url, headers=headers, timeout=30) as http:
        sub = (await http.post("/api/v1/tasks", json={"prompt": "say rest", "profile": "scripted"})).json()
        page = (await http.get(f"/api/v1/tasks/{sub['task_id']}/wait", params={"timeout_s": 10})).json()
        while not page["done"]:
            page = (await http.get(f"/api/v1/tasks/{sub['task_id']}/wait",
                                   params={"cursor": page["cursor"], "timeout_s": 10})).json()
        got = (await http.get(f"/api/v1/tasks/{sub['task_id']}")).json()
        assert got["result"]["text"] == "rest"
        events = (await http.get(f"/api/v1/tasks/{sub['task_id']}/events")).json()["events"]
        assert [e["type"] for e in events] == ["text"]
        bad = await http.post("/api/v1/tasks", content=b"{not json")
        assert bad.status_code == 400 and "JSON" in bad.json()["message"]
        bad = await http.post("/api/v1/tasks", json={"prompt": "say x", "colour": "red"})
        assert bad.status_code == 400 and "unknown fields" in bad.json()["message"]
        assert (await http.get("/api/v1/tasks", params={"limit": "x"})).status_code == 400


async def test_health_readiness_and_prometheus_metrics(hub):
    await hub.start_runner()
    async with httpx2.AsyncClient(base_url=hub.url, headers={"Authorization": f"Bearer {hub.admin_token}"}) as http:
        await http.post("/api/v1/tasks", json={"prompt": "say m", "profile": "scripted"})
        assert (await http.get("/healthz")).json() == {"ok": True}
        ready = (await http.get("/readyz")).json()
        assert ready["ok"] is True
        assert {loop["name"] for loop in ready["loops"] if loop["running"]} == {
            "placement", "reaper", "lease-reaper", "runtime-reaper", "alerts", "chat", "chat-outbox",
            "timeline-sweeper",
            "schedule-firing", "schedule-firing-2", "schedule-reconciler", "runner-pump", "sqlite-checkpoint"}
        text = (await http.get("/metrics")).text
    assert any(f'amux_tasks{{status="{s}"}}' in text for s in ("queued", "dispatched", "running"))
    assert "amux_dispatch_latency_seconds_bucket" in text
    assert 'amux_runtimes{status="online"} 1.0' in text
    assert 'amux_loop_up{loop="placement"} 1.0' in text and 'amux_loop_steps_total{loop="placement"}' in text
