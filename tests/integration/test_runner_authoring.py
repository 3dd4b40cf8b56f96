"""`amux runner --authoring` advertises the authoring capability: a profile with local expert authoring runs there."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.errors import Invalid
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import runtimes
from tests.helpers import REPO, runner_command, started

AUTHOR = {"manifest_version": 2, "name": "author", "engine": "scripted", "description": "writes its own expert",
          "expert": {"authoring": "local"}}


async def capabilities(hub, name: str) -> dict | None:
    async with hub.db.read() as conn:
        row = (await conn.execute(sa.select(runtimes.c.status, runtimes.c.capabilities)
                                  .where(runtimes.c.name == name))).first()
    return row.capabilities if row is not None and row.status == "online" else None


async def spawn(hub, tmp_path: Path, name: str, *flags: str) -> asyncio.subprocess.Process:
    argv = runner_command(hub.url, hub.admin_token, name, 1, tmp_path / name) + list(flags)
    return await asyncio.create_subprocess_exec(*argv, cwd=REPO, env={**os.environ, "AMUX_HOME": str(tmp_path)},
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


async def test_a_runner_started_with_authoring_runs_a_local_authoring_profile_and_one_without_it_cannot(hub, tmp_path):
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    await hub.hub.profiles.add(admin, json.dumps(AUTHOR))
    plain = await spawn(hub, tmp_path, "plain")
    authoring = None
    try:
        caps = await started(lambda: capabilities(hub.hub, "plain"), "runner plain", proc=plain)
        assert caps["authoring"] is False
        hub.hub.settings.profiles.authoring_runtime = "plain"
        with pytest.raises(Invalid, match="authoring capability"):
            await hub.hub.tasks.submit(admin, SubmitRequest(prompt="say written", profile="author"))

        authoring = await spawn(hub, tmp_path, "author-box", "--authoring")
        caps = await started(lambda: capabilities(hub.hub, "author-box"), "runner author-box", proc=authoring)
        assert caps["authoring"] is True
        hub.hub.settings.profiles.authoring_runtime = "author-box"
        sub = await hub.hub.tasks.submit(admin,
                                         SubmitRequest(prompt="say written", profile="author", runtime="author-box"))
        view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=30)
        assert (view["status"], view["runtime"], view["result"]["text"]) == ("succeeded", "author-box", "written"), view
    finally:
        for proc in (plain, authoring):
            if proc is not None:
                proc.kill()
                await proc.wait()
