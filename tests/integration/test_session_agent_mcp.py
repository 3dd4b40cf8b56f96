"""A Session Turn's agent is wired to the hub's MCP endpoint; a task child is not.

End to end: a signed Feishu chat message → the chat Session's Turn → the runner launches the engine CLI
(a fake that, like a real agent, reads the MCP configuration it was launched with and calls `task_submit`
and `schedule_create` with the official MCP client; Pi, which has no MCP client, runs the `amux` CLI with
the same run token) → a Task whose parent Session and Turn are that Turn's, and a schedule whose creator
receipt is that Turn's → the answer posted back to the fake Feishu.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa

from bot.feishu.webhook import encrypt, signature
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.engines.base import Job
from hub.engines.claude import ClaudeEngine
from hub.engines.codex import CodexEngine
from hub.engines.pi import PiEngine
from hub.engines.scripted import ScriptedEngine
from hub.runner.agent import Runner
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import bot_chats, identity_bindings, schedules, task_runs
from tests.fakes.feishu import FakeFeishu, Message, clock_seconds
from tests.helpers import PROCESS_MODE, REPO, eventually, start_hub, started

BIN = REPO / "tests" / "fakes" / "bin"
ADMIN, ALICE = "ou_admin", "ou_alice"
EK, VT = "agent-encrypt-key", "agent-verification-token"
ENGINES = {"claude": ClaudeEngine, "codex": CodexEngine}  # the engines with an MCP client
AGENTS = {**ENGINES, "pi": PiEngine}  # pi has none: its agent runs the `amux` CLI on its PATH


def launcher(tmp_path: Path, engine: str, record: Path, scenario: str) -> Path:
    """An executable that starts the engine's fake with a scenario: the runner passes no test variables through."""
    path = tmp_path / f"{engine}-agent"
    path.write_text(f"#!/bin/sh\nFAKE_SCENARIO={scenario} FAKE_RECORD_DIR={record} exec {sys.executable} "
                    f"{BIN / engine} \"$@\"\n")
    path.chmod(0o755)
    return path


async def post_message(url: str, app_id: str, fake: FakeFeishu, clock: ManualClock, open_id: str, text: str) -> str:
    """Post `text` as Feishu would: an encrypted, signed im.message.receive_v1 webhook; return the message id."""
    mid = f"om_{uuid.uuid4().hex[:12]}"
    fake.messages.setdefault(mid, Message(message_id=mid, receive_id=open_id, uuid=None, content={"text": text},
                                          at=clock.now().timestamp()))
    now_ms = str(int(clock.now().timestamp() * 1000))
    event = {"sender": {"sender_id": {"open_id": open_id, "union_id": f"on_{open_id[3:]}"}, "sender_type": "user",
                        "tenant_key": "t1"},
             "message": {"message_id": mid, "chat_id": f"oc_{open_id}", "chat_type": "p2p", "message_type": "text",
                         "content": json.dumps({"text": text}), "create_time": now_ms, "mentions": []}}
    envelope = {"schema": "2.0",
                "header": {"event_id": uuid.uuid4().hex, "token": VT, "event_type": "im.message.receive_v1",
                           "tenant_key": "t1", "app_id": app_id, "create_time": now_ms},
                "event": event}
    body = json.dumps({"encrypt": encrypt(json.dumps(envelope), EK, os.urandom(16))}).encode()
    ts, nonce = str(int(clock.now().timestamp())), uuid.uuid4().hex
    headers = {"Content-Type": "application/json", "X-Lark-Request-Timestamp": ts, "X-Lark-Request-Nonce": nonce,
               "X-Lark-Signature": signature(ts, nonce, EK, body)}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/feishu/{app_id}/events", data=body,
                                                          headers=headers) as r:
        assert r.status == 200, await r.text()
    return mid


# Long by design: one chat turn's journey; the agent's MCP calls and their attribution are checked in order.
@pytest.mark.parametrize("engine", sorted(AGENTS))
async def test_a_chat_turns_agent_delegates_a_task_and_a_schedule_over_mcp_attributed_to_that_turn(
        engine, sqlite_url: str, tmp_path: Path, clock: ManualClock, monkeypatch):
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv(f"AMUX_{engine.upper()}_BIN", str(launcher(tmp_path, engine, record, "agent-delegates")))
    fake = await FakeFeishu(now=clock_seconds(clock)).start()
    app = FeishuAppSettings(app_id=fake.app_id, app_secret=fake.app_secret, encrypt_key=EK, verification_token=VT,
                            admin_open_id=ADMIN, base_url=fake.base_url)
    handle = await start_hub(sqlite_url, tmp_path, clock, feishu_apps=[app])
    hub = handle.hub
    hub.settings.profiles.default_profile = engine  # the chat's Session runs on this engine
    try:
        runner = Runner(handle.url, handle.admin_token, name="agents", slots=4,
                        **PROCESS_MODE, workspace_root=tmp_path / "ws",
                        engines={engine: AGENTS[engine](), "scripted": ScriptedEngine()})
        handle.runners.append((runner, asyncio.create_task(runner.run_forever())))
        await started(runner.registered.wait(), "the runner to register")

        mid = await post_message(handle.url, fake.app_id, fake, clock, ALICE, "delegate the report and schedule it")
        reply = await eventually(lambda: _reply_to(fake, mid), timeout=60)

        async with hub.db.read() as conn:
            chat = (await conn.execute(sa.select(bot_chats))).one()
            turn = (await conn.execute(sa.select(task_runs).where(task_runs.c.kind == "turn"))).one()
            alice = (await conn.execute(sa.select(identity_bindings)
                                        .where(identity_bindings.c.open_id == ALICE))).one()
        assert turn.session_id == chat.session_id and turn.status == "succeeded", turn.error
        calls = json.loads((record / "delegations.json").read_text())
        via = "cli" if engine == "pi" else "mcp"
        assert [(c["tool"], c["is_error"], c["via"]) for c in calls] == [
            ("task_submit", False, via), ("schedule_create", False, via)], calls
        task_id, schedule_id = calls[0]["result"]["task_id"], calls[1]["result"]["schedule_id"]
        assert task_id in reply and schedule_id in reply  # the agent's answer reached the chat

        admin = await hub.auth.authenticate(handle.admin_token)
        done = await hub.tasks.wait_terminal(admin, task_id, timeout_s=30)
        assert done["status"] == "succeeded" and done["result"]["text"] == "delegated from the chat"
        async with hub.db.read() as conn:
            task = (await conn.execute(sa.select(task_runs).where(task_runs.c.id == task_id))).one()
            sched = (await conn.execute(sa.select(schedules).where(schedules.c.id == schedule_id))).one()
        assert (task.parent_session_id, task.parent_turn_id) == (turn.session_id, turn.id)
        assert task.owner_id == alice.principal_id
        assert (sched.creator_id, sched.creator_binding_id, sched.app_id) == (alice.principal_id, alice.id, fake.app_id)
        assert sched.provenance["turn_id"] == turn.id and sched.provenance["receipt"]["message_id"] == mid

        child = json.loads((record / "environ.json").read_text())
        assert child["AMUX_SESSION_ID"] == turn.session_id
        assert shutil.which("amux", path=child["PATH"])  # the memory CLI is on the child's PATH
        argv = json.loads((record / "argv.json").read_text())
        assert child["AMUX_TOKEN"] not in " ".join(argv)  # the token never reaches argv
        if engine == "pi":  # no MCP configuration at all: the CLI with the same token is its way in
            assert "--mcp-config" not in argv and not (record / "mcp_config.json").exists()
            return
        config = json.loads((record / "mcp_config.json").read_text())
        if engine == "claude":
            path = Path(config["path"])
            assert config["mode"] == "0o600" and path.parent == Path(child["HOME"]) and not path.exists()
            server = config["config"]["mcpServers"]["amux"]
            assert server == {"type": "http", "url": f"{handle.url}/mcp",
                              "headers": {"Authorization": f"Bearer {child['AMUX_TOKEN']}"}}
        else:
            assert config["config"] == {"amux": {"url": f"{handle.url}/mcp", "bearer_token_env_var": "AMUX_TOKEN"}}
    finally:
        await handle.stop()
        await fake.stop()


async def _reply_to(fake: FakeFeishu, mid: str) -> str | None:
    """The progress card under `mid` once it became the answer (its Stop button gone)."""
    for m in fake.sent:
        if m.reply_to == mid:
            shown = json.dumps(m.updates[-1] if m.updates else m.content)
            return None if '"op": "stop"' in shown else shown
    return None


# ---------------------------------------------------------------------------------------------- adapter level

def job(tmp_path: Path, engine: str, env: dict[str, str], scenario: str = "success") -> Job:
    record, workspace, home = tmp_path / "record", tmp_path / "ws", tmp_path / "home"
    for folder in (record, workspace, home):
        folder.mkdir(exist_ok=True)
    snapshot = {"engine": engine, "permission_policy": "policy-allow", "native_args": [], "timeout_s": 60}
    return Job("tr_1", 1, "say hello", snapshot, workspace,
               env={"HOME": str(home), "FAKE_SCENARIO": scenario, "FAKE_RECORD_DIR": str(record), **env})


COORDINATION = {"AMUX_HUB_URL": "http://127.0.0.1:9", "AMUX_TOKEN": "amux.run.secret-token-value"}


async def _noop(kind: str, payload: dict) -> None:
    return None


@pytest.mark.parametrize("engine", sorted(ENGINES))
async def test_a_task_child_gets_no_task_mcp_tools(engine, tmp_path: Path, monkeypatch):
    monkeypatch.setenv(f"AMUX_{engine.upper()}_BIN", str(BIN / engine))
    j = job(tmp_path, engine, COORDINATION)
    result = await asyncio.wait_for(ENGINES[engine]().run(j, _noop), 20)
    assert result.outcome == "succeeded", result.error
    argv = json.loads((tmp_path / "record" / "argv.json").read_text())
    assert "--mcp-config" not in argv and not any(a.startswith("mcp_servers.") for a in argv), argv


async def test_a_session_turns_claude_config_file_is_private_in_its_home_and_removed_after_the_run(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.setenv("AMUX_CLAUDE_BIN", str(BIN / "claude"))
    j = job(tmp_path, "claude", {**COORDINATION, "AMUX_SESSION_ID": "ses_1"})
    seen: dict = {}

    async def emit(kind: str, payload: dict) -> None:
        if not seen:  # while the CLI runs, the file is there, 0600, in the run's HOME
            argv = json.loads((tmp_path / "record" / "argv.json").read_text())
            path = Path(argv[argv.index("--mcp-config") + 1])
            seen.update(path=path, mode=path.stat().st_mode & 0o777, config=json.loads(path.read_text()))

    result = await asyncio.wait_for(ClaudeEngine().run(j, emit), 20)
    assert result.outcome == "succeeded", result.error
    assert seen["path"].parent == tmp_path / "home" and seen["mode"] == 0o600 and not seen["path"].exists()
    assert seen["config"]["mcpServers"]["amux"]["headers"] == {"Authorization": "Bearer amux.run.secret-token-value"}
    assert "amux.run.secret-token-value" not in (tmp_path / "record" / "argv.json").read_text()


@pytest.mark.parametrize("engine", sorted(ENGINES))
async def test_a_plain_tasks_child_gets_the_memory_cli_and_a_run_token_but_no_mcp_server(engine, hub, tmp_path,
                                                                                        monkeypatch):
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv(f"AMUX_{engine.upper()}_BIN", str(launcher(tmp_path, engine, record, "success")))
    runner = Runner(hub.url, hub.admin_token, name="tasks", slots=1, **PROCESS_MODE, workspace_root=tmp_path / "ws",
                    engines={engine: ENGINES[engine]()})
    hub.runners.append((runner, asyncio.create_task(runner.run_forever())))
    await started(runner.registered.wait(), "the runner to register")
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sub = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="say hello", profile=engine))
    view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=30)
    assert view["status"] == "succeeded", view
    child = json.loads((record / "environ.json").read_text())
    argv = json.loads((record / "argv.json").read_text())
    assert "AMUX_SESSION_ID" not in child and child["AMUX_TOKEN"] and child["AMUX_HUB_URL"] == hub.url
    assert shutil.which("amux", path=child["PATH"])  # memory: `amux memory …`
    assert "--mcp-config" not in argv and not any(a.startswith("mcp_servers.") for a in argv), argv
