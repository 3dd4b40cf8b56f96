"""Every task child can use memory and coordination, in a session or not: AMUX_HUB_URL, its run's AMUX_TOKEN and a
memory scope resolved with its effective principal; `amux memory` works inside a plain Task's child (a real runner
process, a real CLI child), and a runtime without the memory capability gives a warning and no memory, no fallback."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.engines.claude import ClaudeEngine
from hub.errors import NotFound
from hub.runner.agent import Runner
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import runtimes
from tests.helpers import PROCESS_MODE, REPO, runner_command, started

FAKE_CLAUDE = Path(__file__).resolve().parent.parent / "fakes" / "bin" / "claude"


def agent_that_uses_memory(tmp_path: Path) -> tuple[Path, Path]:
    """Write a CLI that, like an agent following its instructions, calls `amux memory` and then answers as the fake
    Claude Code does; return (its path, the folder where it records what it saw)."""
    record = tmp_path / "record"
    record.mkdir()
    script = tmp_path / "claude"
    script.write_text(f"""#!/bin/sh
{{
  amux memory set plan "from the task child"; echo "set=$?"
  amux memory get plan --json; echo "get=$?"
}} > {record}/memory.txt 2>&1
env > {record}/env.txt
FAKE_RECORD_DIR={record} exec {FAKE_CLAUDE} "$@"
""")
    script.chmod(0o755)
    return script, record


async def online(hub, name: str) -> bool:
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(runtimes.c.status).where(runtimes.c.name == name))).scalar() == "online"


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


async def test_a_plain_tasks_child_uses_amux_memory_in_its_owners_scope_with_its_own_run_token(hub, tmp_path):
    assert hub.hub.settings.memory.user_isolation  # the default: the scope shows whose memory the child used
    script, record = agent_that_uses_memory(tmp_path)
    runner_token = await hub.hub.auth.create_token("ops", admin=True, runner=True)  # a shared runtime
    env = {**os.environ, "AMUX_CLAUDE_BIN": str(script), "HOME": str(tmp_path / "runner-home")}
    proc = await asyncio.create_subprocess_exec(*runner_command(hub.url, runner_token, "memhost", 1, tmp_path / "ws"),
                                                cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        await started(lambda: online(hub.hub, "memhost"), "runner memhost online", proc=proc)
        alice = await hub.hub.auth.authenticate(await hub.token("alice"))
        sub = await hub.hub.tasks.submit(alice, SubmitRequest(prompt="plan the release", profile="claude"))
        view = await hub.hub.tasks.wait_terminal(alice, sub["task_id"], timeout_s=60)
    finally:
        proc.terminate()
        await proc.wait()
    assert view["status"] == "succeeded", view
    said = (record / "memory.txt").read_text()
    assert "set=0" in said and "get=0" in said, said
    got = json.loads(said[said.index("{"):said.rindex("}") + 1])
    assert got == {"scope": f"principal:{alice.principal_id}", "key": "plan", "value": "from the task child"}
    assert (await hub.hub.memory.get(alice, "plan"))["value"] == "from the task child"  # the owner's own memory
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    with pytest.raises(NotFound):
        await hub.hub.memory.get(admin, "plan")  # another principal's scope never sees it
    child = parse_env((record / "env.txt").read_text())
    assert child["AMUX_HUB_URL"] == hub.url and child["AMUX_TOKEN"] not in (runner_token, hub.admin_token)
    assert "AMUX_SESSION_ID" not in child  # a plain Task is no Session
    argv = json.loads((record / "argv.json").read_text())
    assert "--mcp-config" not in argv  # task children get the memory CLI, never task MCP tools
    assert not [e for e in (await hub.hub.tasks.events(alice, sub["task_id"]))["events"] if e["type"] == "warning"]


class NoMemoryRunner(Runner):
    """A real runner on a machine where capability discovery found no `amux` CLI."""

    def capabilities(self) -> dict:
        """Report this machine without the memory capability."""
        return {**super().capabilities(), "memory_cli": False}


async def test_a_plain_task_on_a_runtime_without_the_memory_capability_gets_a_warning_and_no_memory(
        hub, tmp_path, monkeypatch):
    script, record = agent_that_uses_memory(tmp_path)
    monkeypatch.setenv("AMUX_CLAUDE_BIN", str(script))
    runner = NoMemoryRunner(hub.url, hub.admin_token, name="bare", slots=1,
                            **PROCESS_MODE, workspace_root=tmp_path / "ws",
                            engines={"claude": ClaudeEngine()})
    hub.runners.append((runner, asyncio.create_task(runner.run_forever())))
    await started(runner.registered.wait(), "the runner to register")
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sub = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="plan the release", profile="claude"))
    view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=60)
    assert view["status"] == "succeeded", view
    said = (record / "memory.txt").read_text()
    assert "set=3" in said and "this run has no amux memory" in said and "no global fallback" in said, said
    warnings = [e["text"] for e in (await hub.hub.tasks.events(admin, sub["task_id"]))["events"]
                if e["type"] == "warning"]
    assert warnings == ["memory capability discovery failed on this runtime (no `amux memory` CLI); "
                        "this run has no amux memory"]
    with pytest.raises(NotFound):
        await hub.hub.memory.get(admin, "plan")  # nothing was written anywhere
