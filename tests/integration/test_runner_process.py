"""A real `amux runner` subprocess against a hub on a real port: dispatch, kill -9, hub restart."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import sqlalchemy as sa

from hub.services.tasks.service import SubmitRequest
from hub.store.tables import reservations, runtimes
from tests.helpers import REPO, eventually, runner_command, start_hub, started


async def spawn_runner(url: str, token: str, tmp_path: Path, name: str = "proc", slots: int = 2):
    return await asyncio.create_subprocess_exec(
        *runner_command(url, token, name, slots, tmp_path / "ws"), cwd=REPO,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "AMUX_HOME": str(tmp_path)})


async def runtime_status(hub, name: str):
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(runtimes.c.status).where(runtimes.c.name == name))).scalar()


async def task_status(handle, caller, task_id):
    return (await handle.hub.tasks.get(caller, task_id))["status"]


async def test_tasks_run_end_to_end_on_a_real_runner_process(hub, tmp_path):
    proc = await spawn_runner(hub.url, hub.admin_token, tmp_path)
    try:
        await started(lambda: runtime_status(hub.hub, "proc"), "runner proc", proc=proc)
        admin = await hub.hub.auth.authenticate(hub.admin_token)
        sub = await hub.hub.tasks.submit(admin,
                                         SubmitRequest(prompt="say from a process\nwrite a.txt x", profile="scripted"))
        view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=20)
        assert view["status"] == "succeeded" and view["result"]["text"] == "from a process"
        assert view["runtime"] == "proc" and view["changed_files"]["created"] == ["a.txt"]
    finally:
        proc.kill()
        await proc.wait()


async def test_kill_9_of_a_runner_mid_task_ends_it_failed_runtime_lost_and_releases_capacity(hub, tmp_path):
    proc = await spawn_runner(hub.url, hub.admin_token, tmp_path)
    await started(lambda: runtime_status(hub.hub, "proc"), "runner proc", proc=proc)
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sub = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="say started\nsleep 60", profile="scripted"))
    await eventually(lambda: _is(task_status(hub, admin, sub["task_id"]), "running"))
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    await eventually(lambda: _is(runtime_status(hub.hub, "proc"), "offline"))
    hub.clock.advance(hub.hub.settings.hub.runtime_lost_s + 1)
    await hub.hub.dispatcher.reap_once()
    view = await hub.hub.tasks.get(admin, sub["task_id"])
    assert view["status"] == "failed" and "runtime lost" in view["error"]
    async with hub.hub.db.read() as conn:
        active = (await conn.execute(sa.select(sa.func.count()).select_from(reservations)
                                     .where(reservations.c.state != "released"))).scalar()
    assert active == 0


async def test_after_a_hub_restart_mid_task_the_task_completes_when_the_runner_reconnects(sqlite_url, tmp_path, clock):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    first = await start_hub(sqlite_url, tmp_path, clock, port=port)
    proc = await spawn_runner(first.url, first.admin_token, tmp_path)
    try:
        await started(lambda: runtime_status(first.hub, "proc"), "runner proc", proc=proc)
        admin = await first.hub.auth.authenticate(first.admin_token)
        sub = await first.hub.tasks.submit(admin,
                                           SubmitRequest(prompt="say before\nsleep 1.5\nsay after", profile="scripted"))
        await eventually(lambda: _is(task_status(first, admin, sub["task_id"]), "running"))
        await first.stop()
        second = await start_hub(sqlite_url, tmp_path, clock, port=port)
        try:
            view = await second.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=30)
            assert view["status"] == "succeeded" and view["result"]["text"] == "before\nafter"
            page = await second.hub.tasks.events(admin, sub["task_id"])
            assert [e["text"] for e in page["events"]] == ["before", "after"]
        finally:
            await second.stop()
    finally:
        proc.kill()
        await proc.wait()


async def _is(awaitable, expected):
    return (await awaitable) == expected
