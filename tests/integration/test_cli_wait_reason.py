"""`amux task submit --wait` says why a task waits while it waits, and again when the reason changes."""
from __future__ import annotations

import asyncio
import os
import sys

from hub.services.tasks.service import SubmitRequest
from tests.helpers import REPO, start_hub, started


async def test_task_submit_wait_prints_why_the_task_is_queued_and_again_when_the_reason_changes(
        sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path / "home", clock)
    try:
        busy = await hub.start_runner("r1", slots=1)
        admin = await hub.hub.auth.authenticate(hub.admin_token)
        first = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="sleep 600", profile="scripted"))

        async def running() -> bool:
            return (await hub.hub.tasks.get(admin, first["task_id"])).status == "running"

        await started(running, "the first task to hold r1's only slot", timeout=30)
        env = {**os.environ, "AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hub.cli", "task", "submit", "--profile", "scripted", "--wait", "say second",
            cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        lines: list[str] = []

        async def line_with(text: str) -> str:
            while True:
                line = (await started(cli.stdout.readline(), f"the CLI to print {text!r}", proc=cli)).decode()
                assert line, f"the CLI ended first: {''.join(lines)}"
                lines.append(line)
                if text in line:
                    return line

        busy_line = await line_with("queued: ")
        assert "waiting for a free slot" in busy_line and "all busy" in busy_line, busy_line
        await busy.stop()  # the only runtime goes away: the reason changes
        offline = await line_with("queued: ")
        assert "r1 offline" in offline, offline
        await hub.start_runner("r2", slots=1)
        await line_with("succeeded")
        assert await cli.wait() == 0
        assert sum(line.startswith("queued: ") for line in lines) == 2, lines  # said once per reason
    finally:
        await hub.stop()
