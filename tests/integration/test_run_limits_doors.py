"""A task's `limits` on every door (REST, the official MCP client, the CLI) and a profile's: frozen in the snapshot
as asked, refused with the field and the fix when malformed; the task view shows what its runtime applies."""
from __future__ import annotations

import asyncio
import json
import os
import sys

import aiohttp

from tests.helpers import REPO, mcp_client, start_hub


async def test_a_tasks_limits_are_frozen_as_asked_on_rest_mcp_and_the_cli_and_bad_ones_are_refused(
        sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path / "home", clock)
    try:
        await hub.start_runner("r1", slots=1)
        headers = {"Authorization": f"Bearer {hub.admin_token}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            body = {"prompt": "say hi", "profile": "scripted", "limits": {"memory_max": "512MiB", "pids_max": 128}}
            async with http.post(f"{hub.url}/api/v1/tasks", json=body) as r:
                assert r.status in (200, 201), await r.text()
                task_id = (await r.json())["task_id"]
            async with http.get(f"{hub.url}/api/v1/tasks/{task_id}") as r:
                view = await r.json()
            assert view["snapshot"]["limits"] == {"memory_max": 512 << 20, "pids_max": 128}
            assert view["limits"] is None  # the in-process scripted engine starts no child: nothing to limit
            for bad, named in (({"memory_max": "lots"}, "memory_max"), ({"pids_max": 0}, "pids_max"),
                               ({"swap": 1}, "swap")):
                async with http.post(f"{hub.url}/api/v1/tasks", json={**body, "limits": bad}) as r:
                    assert r.status == 400, await r.text()
                    assert named in (await r.json())["message"]
            profile = ('manifest_version = 2\nname = "small"\nengine = "scripted"\n'
                       '[limits]\nmemory_max = "1GiB"\npids_max = 64\n')
            async with http.post(f"{hub.url}/api/v1/profiles", data=profile,
                                 headers={"Content-Type": "text/plain"}) as r:
                assert r.status in (200, 201), await r.text()
            async with http.post(f"{hub.url}/api/v1/tasks", json={"prompt": "say hi", "profile": "small",
                                                                  "limits": {"pids_max": 4096, "cpu_max": 0.5}}) as r:
                small = await r.json()
            async with http.get(f"{hub.url}/api/v1/tasks/{small['task_id']}") as r:
                frozen = (await r.json())["snapshot"]["limits"]
            assert frozen == {"memory_max": 1 << 30, "pids_max": 64, "cpu_max": 0.5}  # a request cannot raise it
        async with mcp_client(hub.url, hub.admin_token) as client:
            res = await client.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted",
                                                         "limits": {"memory_max": "2GiB", "cpu_max": 1.5}})
            assert not res.is_error, res.content[0].text
            got = await client.call_tool("task_get", {"task_id": res.structured_content["task_id"]})
            assert got.structured_content["snapshot"]["limits"] == {"memory_max": 2 << 30, "cpu_max": 1.5}
            bad = await client.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted",
                                                         "limits": {"pids_max": -3}})
            assert bad.is_error and "pids_max" in bad.content[0].text
        env = {**os.environ, "AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hub.cli", "task", "submit", "--profile", "scripted", "--memory-max", "300MiB",
            "--pids-max", "32", "--json", "say hi", cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE)
        out, _ = await cli.communicate()
        assert cli.returncode == 0, out
        caller = await hub.hub.auth.authenticate(hub.admin_token)
        view = await hub.hub.tasks.get(caller, json.loads(out)["task_id"])
        assert view["snapshot"]["limits"] == {"memory_max": 300 << 20, "pids_max": 32}
    finally:
        await hub.stop()
