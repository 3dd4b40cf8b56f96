"""Task children get a clean environment: the allowlist, a per-run HOME, the profile's credentials and a run token."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa

from hub.engines.claude import ClaudeEngine
from hub.runner.agent import Runner
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import runtimes
from tests.helpers import PROCESS_MODE, REPO, runner_command, started

BIN = Path(__file__).resolve().parent.parent / "fakes" / "bin"
# What a runner process may hold that no task child may see.
SENTINELS = {
    "AMUX_SECRET_KEY": "sentinel-secret-key",
    "AMUX_DATABASE_URL": "postgresql://sentinel:pw@db/amux",
    "AMUX_HOME": "/sentinel/amux-home",
    "AWS_SECRET_ACCESS_KEY": "sentinel-aws",
    "SENTINEL_RUNNER_ONLY": "sentinel-value",
}


async def runtime_online(hub, name: str) -> bool:
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(runtimes.c.status).where(runtimes.c.name == name))).scalar() == "online"


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


async def test_a_scripted_subprocess_child_of_a_real_runner_process_sees_none_of_the_runners_variables(hub, tmp_path):
    runner_token = await hub.hub.auth.create_token("ops", admin=True, runner=True)
    argv = [a for a in runner_command(hub.url, runner_token, "envcheck", 1, tmp_path / "ws")]
    i = argv.index("--token-file")
    del argv[i:i + 2]  # the runner takes its token from AMUX_TOKEN, as operators often run it
    env = {**os.environ, **SENTINELS, "AMUX_TOKEN": runner_token, "HOME": str(tmp_path / "runner-home")}
    proc = await asyncio.create_subprocess_exec(*argv, cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        await started(lambda: runtime_online(hub.hub, "envcheck"), "runner envcheck online", proc=proc)
        admin = await hub.hub.auth.authenticate(hub.admin_token)
        sub = await hub.hub.tasks.submit(admin,
                                         SubmitRequest(prompt="env *", profile="scripted", extra_args=["--subprocess"],
                                                              runtime="envcheck"))
        view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=30)
    finally:
        proc.terminate()
        await proc.wait()
    assert view["status"] == "succeeded", view
    child = parse_env(view["result"]["text"])
    assert not set(SENTINELS) & set(child), child
    assert not any(v in view["result"]["text"] for v in SENTINELS.values())
    assert runner_token not in view["result"]["text"]  # the run token replaces it (its value is redacted)
    assert child["AMUX_TOKEN"] == "[redacted]" and child["AMUX_HUB_URL"] == hub.url
    assert "AMUX_SESSION_ID" not in child  # a plain task is no session
    assert child["HOME"] != env["HOME"] and Path(child["HOME"]).name.startswith(sub["task_id"])
    assert set(child) <= {"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "IS_SANDBOX",
                          "AMUX_HUB_URL", "AMUX_TOKEN"} | {k for k in child if k.startswith("LC_")}, sorted(child)


@pytest.fixture
def fake_claude(monkeypatch):
    monkeypatch.setenv("AMUX_CLAUDE_BIN", str(BIN / "claude"))
    for k, v in SENTINELS.items():
        monkeypatch.setenv(k, v)


async def test_a_cli_child_sees_none_of_the_runners_variables_and_its_token_stops_working_when_the_run_ends(
        hub, tmp_path, fake_claude):
    record = tmp_path / "record"
    record.mkdir()
    runner_token = await hub.hub.auth.create_token("ops", admin=True, runner=True)
    runner = Runner(hub.url, runner_token, name="clihost", slots=1, **PROCESS_MODE, workspace_root=tmp_path / "ws",
                    engines={"claude": ClaudeEngine()})
    hub.runners.append((runner, asyncio.create_task(runner.run_forever())))
    await started(runner.registered.wait(), "the runner to register")
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    await hub.hub.credentials.declare(admin, "fakecli", ["FAKE_RECORD_DIR"])
    await hub.hub.credentials.set_value(admin, "fakecli", "FAKE_RECORD_DIR", str(record))
    sub = await hub.hub.tasks.submit(admin,
                                     SubmitRequest(prompt="hello", profile="claude", credential_profile="fakecli"))
    view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=30)
    assert view["status"] == "succeeded", view
    child = json.loads((record / "environ.json").read_text())
    assert not set(SENTINELS) & set(child), sorted(child)
    assert child["FAKE_RECORD_DIR"] == str(record)  # the credential the profile declares
    assert child["AMUX_TOKEN"] not in (runner_token, hub.admin_token)
    assert child["HOME"] != os.environ.get("HOME") and not Path(child["HOME"]).exists()  # per-run, removed after
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{hub.url}/api/v1/memory",
                            headers={"Authorization": f"Bearer {child['AMUX_TOKEN']}"}) as r:
            assert r.status == 401, await r.text()
