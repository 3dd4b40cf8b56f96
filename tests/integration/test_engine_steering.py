"""`instance_steer` reaches a real engine's running turn through the engine's own protocol, over a real `amux runner`
subprocess and a fake CLI speaking the recorded protocol: Claude Code's stream-json input (`user` lines), Pi's RPC
`steer` command, Codex app-server's `turn/steer`. An engine that cannot take input mid-turn answers `queued`, with
the reason, and the correction waits in the mailbox."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import AsyncIterator

import pytest
import sqlalchemy as sa

from hub.store.tables import runtimes
from tests.helpers import REPO, eventually, runner_command

FAKES = Path(__file__).resolve().parent.parent / "fakes" / "bin"
# engine → (scenario, permission policy, what the runner takes the correction through)
CASES = {"claude": ("steer-mid-tool", "policy-allow", "stream-json user line"),
         "pi": ("steer", "policy-allow", "RPC steer command"),
         "codex": ("steer", "escalate-to-main", "app-server turn/steer")}
CORRECTION = "stop building; run make test instead"


def wrapper(tmp_path: Path, engine: str, scenario: str) -> tuple[Path, Path]:
    """A CLI on the runner's PATH that plays the recorded scenario through the engine's fake; and its record."""
    record = tmp_path / f"record-{engine}"
    record.mkdir()
    script = tmp_path / engine
    script.write_text(f"#!/bin/sh\nFAKE_SCENARIO={scenario} FAKE_RECORD_DIR={record} exec {FAKES / engine} \"$@\"\n")
    script.chmod(0o755)
    return script, record


async def online(hub, name: str) -> bool:  # noqa: ANN001
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(runtimes.c.status).where(runtimes.c.name == name))).scalar() == "online"


@contextlib.asynccontextmanager
async def runner_process(hub, tmp_path: Path, bins: dict[str, Path]) -> AsyncIterator[None]:  # noqa: ANN001
    token = await hub.hub.auth.create_token("ops", admin=True, runner=True)
    env = {**os.environ, "HOME": str(tmp_path / "runner-home"),
           **{f"AMUX_{name.upper()}_BIN": str(path) for name, path in bins.items()}}
    proc = await asyncio.create_subprocess_exec(*runner_command(hub.url, token, "steerhost", 2, tmp_path / "ws"),
                                                cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        await eventually(lambda: online(hub.hub, "steerhost"), timeout=60)
        yield
    finally:
        proc.terminate()
        await proc.wait()


async def running_tool(hub, caller, task_id: str) -> bool:  # noqa: ANN001
    """The run's first tool call is recorded: the fake CLI now waits for input."""
    events = (await hub.hub.tasks.events(caller, task_id))["events"]
    return any(e["type"] == "tool" for e in events)


async def started(hub, caller, iid: str) -> str:  # noqa: ANN001
    async def current() -> str | None:
        view = await hub.hub.instances.get(caller, iid)
        return view["current_task_id"] if view["current_task_status"] == "running" else None
    return await eventually(current, timeout=60)


@pytest.mark.parametrize("engine", sorted(CASES))
async def test_instance_steer_is_delivered_into_the_running_turn_of_each_real_engine(engine, hub, tmp_path):
    scenario, policy, _how = CASES[engine]
    script, record = wrapper(tmp_path, engine, scenario)
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    async with runner_process(hub, tmp_path, {engine: script}):
        inst = await hub.hub.instances.create(alice, profile=engine, permission_policy=policy, prompt="build it")
        task_id = await started(hub, alice, inst["instance_id"])
        await eventually(lambda: running_tool(hub, alice, task_id), timeout=60)
        steered = await hub.hub.instances.steer(alice, inst["instance_id"], CORRECTION)
        assert steered["delivery"] == "delivered", steered
        view = await hub.hub.tasks.wait_terminal(alice, task_id, timeout_s=60)
    assert (view["status"], view["result"]["text"]) == ("succeeded", f"Changing course: {CORRECTION}"), view
    sent = [json.loads(line) for line in (record / "stdin.jsonl").read_text().splitlines()]
    assert any(CORRECTION in json.dumps(m) for m in sent)  # it went down the engine's own input channel


async def test_an_engine_that_takes_no_input_mid_turn_answers_queued_with_the_reason(hub, tmp_path):
    script, _record = wrapper(tmp_path, "codex", "slow")
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    async with runner_process(hub, tmp_path, {"codex": script}):
        inst = await hub.hub.instances.create(alice, profile="codex", permission_policy="policy-allow",
                                              prompt="build it")
        task_id = await started(hub, alice, inst["instance_id"])
        await eventually(lambda: running_tool(hub, alice, task_id), timeout=60)
        steered = await hub.hub.instances.steer(alice, inst["instance_id"], CORRECTION)
        await hub.hub.tasks.cancel(alice, task_id)
    assert steered["delivery"] == "queued", steered
    assert "codex exec" in steered["reason"] and "takes no input during it" in steered["reason"]
    assert steered["reason"] in steered["note"]

