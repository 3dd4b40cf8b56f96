"""Two hub processes on one PostgreSQL: no routing state lives in one process's memory."""
from __future__ import annotations

import asyncio
import os
import socket
import sys

import httpx2

from tests.helpers import REPO, mcp_client, runner_command, start_hub, started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_task_admitted_on_one_hub_runs_on_a_runner_connected_to_another(pg_url, tmp_path, clock):
    port = free_port()
    home = tmp_path / "replica-b"
    env = {**os.environ, "AMUX_HOME": str(home), "AMUX_HUB__POLL_S": "0.05"}
    replica_b = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", "hub", "serve", "--db", pg_url, "--listen", f"127.0.0.1:{port}",
        cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    runner = None
    replica_a = await start_hub(pg_url, tmp_path / "replica-a", clock)
    try:
        b_url = f"http://127.0.0.1:{port}"

        async def b_ready():
            try:
                async with httpx2.AsyncClient() as http:
                    return (await http.get(f"{b_url}/readyz")).status_code == 200 and (home / "admin.token").exists()
            except httpx2.TransportError:
                return False

        await started(b_ready, "replica b", proc=replica_b)
        token_b = (home / "admin.token").read_text().strip()
        runner = await asyncio.create_subprocess_exec(
            *runner_command(b_url, token_b, "on-b", 2, tmp_path / "ws"), cwd=REPO, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        async with mcp_client(replica_a.url, replica_a.admin_token) as c:
            async def runtime_online():
                res = await c.call_tool("task_submit", {"prompt": "say across replicas", "profile": "scripted"})
                return None if res.is_error else res.structured_content

            sub = await started(runtime_online, "runner on-b online", proc=runner, interval=0.2)
            done = (await c.call_tool("task_wait", {"task_id": sub["task_id"], "timeout_s": 20})).structured_content
            while not done["done"]:
                done = (await c.call_tool("task_wait", {"task_id": sub["task_id"], "cursor": done["cursor"],
                                                        "timeout_s": 20})).structured_content
            view = (await c.call_tool("task_get", {"task_id": sub["task_id"]})).structured_content
        assert view["status"] == "succeeded" and view["runtime"] == "on-b"
        assert view["result"]["text"] == "across replicas"
    finally:
        for proc in (runner, replica_b):
            if proc is not None:
                proc.kill()
                await proc.wait()
        await replica_a.stop()


async def test_two_hubs_starting_at_the_same_instant_on_an_empty_postgres_both_come_up(tmp_path):
    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import create_async_engine

    from tests.helpers import PG_URL

    name = f"amux_empty_{os.getpid()}_{free_port()}"
    admin = create_async_engine(PG_URL, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = str(sa.engine.make_url(PG_URL).set(database=name).render_as_string(hide_password=False))
    ports, procs = [free_port(), free_port()], []
    try:
        for i, port in enumerate(ports):  # no waiting between them: migrations and the admin principal race
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "hub.cli", "hub", "serve", "--db", url, "--listen", f"127.0.0.1:{port}", cwd=REPO,
                env={**os.environ, "AMUX_HOME": str(tmp_path / f"h{i}")},
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL))

        async def both_ready():
            try:
                async with httpx2.AsyncClient() as http:
                    codes = [(await http.get(f"http://127.0.0.1:{p}/readyz")).status_code for p in ports]
                return codes == [200, 200] and all((tmp_path / f"h{i}" / "admin.token").exists() for i in range(2))
            except httpx2.TransportError:
                return False

        await started(both_ready, "both replicas", interval=0.2)
        assert all(p.returncode is None for p in procs)
    finally:
        for p in procs:
            p.kill()
            await p.wait()
        async with admin.connect() as conn:
            await conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()
