"""Codex under escalate-to-main drives `codex app-server` (a fake speaking codex 0.171's JSON-RPC, as a real
subprocess): its approval requests become `permission` events answered like Claude's, and a codex without
app-server is refused before launch, naming the fix."""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from hub.domain.events import project

from hub.domain.policy import normalize_native_args
from hub.engines.base import EngineResult, Job, PermissionReply
from hub.engines.codex import CodexEngine
from tests.helpers import PROCESS_MODE, REPO, started

BIN = REPO / "tests" / "fakes" / "bin"
AS_ROOT = os.geteuid() == 0
THREAD, TURN = "019ac0de-0000-7000-8000-00000000a001", "019ac0de-0000-7000-8000-00000000b001"


@pytest.fixture(autouse=True)
def fake_codex(monkeypatch):
    monkeypatch.setenv("AMUX_CODEX_BIN", str(BIN / "codex"))


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.changed = asyncio.Event()

    async def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        self.events.append((kind, payload))
        self.changed.set()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [p for k, p in self.events if k == kind]

    async def wait_for(self, kind: str, count: int = 1) -> list[dict[str, Any]]:
        async def wait() -> list[dict[str, Any]]:
            while len(self.of(kind)) < count:
                self.changed.clear()
                await self.changed.wait()
            return self.of(kind)
        return await asyncio.wait_for(wait(), 10)


def job(tmp_path: Path, scenario: str, *, policy: str = "escalate-to-main", extra: list[str] | None = None,
        model: str | None = None, effort: str | None = None, resume: str | None = None, **env: str) -> Job:
    native = normalize_native_args("codex", policy, extra or [], as_root=AS_ROOT)
    record, workspace = tmp_path / "record", tmp_path / "ws"
    record.mkdir(exist_ok=True)
    workspace.mkdir(exist_ok=True)
    snapshot = {"engine": "codex", "model": model, "reasoning_effort": effort, "permission_policy": policy,
                "native_args": native.args, "resume_handle": resume, "timeout_s": 60}
    return Job("tr_1", 1, "say hello", snapshot, workspace,
               env={**native.env, "FAKE_SCENARIO": scenario, "FAKE_RECORD_DIR": str(record), **env})


def recorded(tmp_path: Path, name: str) -> Any:
    path = tmp_path / "record" / name
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return json.loads(path.read_text()) if path.exists() else None


async def run(j: Job, emit: Recorder) -> EngineResult:
    return await asyncio.wait_for(CodexEngine().run(j, emit), 20)


async def test_escalate_to_main_launches_the_app_server_with_the_policy_as_thread_parameters(tmp_path):
    j = job(tmp_path, "success",
            extra=["--skip-git-repo-check", "-c", 'model_providers.x.name="x"', "--enable", "hooks"],
            model="gpt-5.1-codex", effort="high")
    result = await run(j, emit := Recorder())
    assert (result.outcome, result.text, result.resume_handle) == ("succeeded", "Hello from Codex.",
                                                                   THREAD), result.error
    assert recorded(tmp_path, "argv.json") == ["app-server", "-c", 'model_providers.x.name="x"', "--enable", "hooks"]
    thread = recorded(tmp_path, "thread.json")
    assert thread == {"method": "thread/start", "params": {"cwd": str(j.workspace), "sandbox": "danger-full-access",
                                                           "approvalPolicy": "on-request", "model": "gpt-5.1-codex"}}
    assert recorded(tmp_path, "turn.json")["effort"] == "high" and recorded(tmp_path, "prompt.json") == "say hello"
    assert [m.get("method") for m in recorded(tmp_path, "stdin.jsonl")] == [
        "initialize", "initialized", "thread/start", "turn/start"]
    assert emit.of("text") == [{"text": "Hello from Codex."}]
    assert emit.of("usage") == [{"usage": {"input_tokens": 2140, "cached_input_tokens": 1024, "output_tokens": 31,
                                           "reasoning_tokens": 0, "total_tokens": 2171, "context_window": 272000}}]


async def test_a_resume_handle_resumes_that_thread_over_the_app_server(tmp_path):
    result = await run(job(tmp_path, "success", resume="prev-thread"), Recorder())
    assert result.outcome == "succeeded", result.error
    assert recorded(tmp_path, "thread.json")["method"] == "thread/resume"
    assert recorded(tmp_path, "thread.json")["params"]["threadId"] == "prev-thread"


@pytest.mark.parametrize("allow,text,status", [(True, "Tests pass.", "completed"),
                                               (False, "I could not run the tests without approval.", "failed")])
async def test_a_command_approval_becomes_a_permission_event_and_the_reply_reaches_codex(tmp_path, allow, text, status):
    j = job(tmp_path, "approval")
    emit = Recorder()
    running = asyncio.ensure_future(run(j, emit))
    (asked,) = await emit.wait_for("permission")
    assert asked == {"request_id": f"{TURN}.0", "tool": "command_execution", "title": "pytest"}
    j.permission_replies.put_nowait(PermissionReply(asked["request_id"], allow, "" if allow else "not now"))
    result = await running
    assert (result.outcome, result.text) == ("succeeded", text), result.error
    replies = [m for m in recorded(tmp_path, "stdin.jsonl") if m.get("id") == 0 and "result" in m]
    assert replies == [{"id": 0, "result": {"decision": "accept" if allow else "decline"}}]
    assert [t["tool"]["status"] for t in emit.of("tool")] == ["running", status]
    # the command's arguments and output stay off task events (the Agent Timeline keeps them)
    assert "SECRET" not in json.dumps([project(k, p) for k, p in emit.events])


async def test_a_file_change_approval_is_titled_with_the_files_it_touches(tmp_path):
    j = job(tmp_path, "file-approval")
    emit = Recorder()
    running = asyncio.ensure_future(run(j, emit))
    (asked,) = await emit.wait_for("permission")
    assert (asked["tool"], asked["title"]) == ("file_change", "src/app.py")
    j.permission_replies.put_nowait(PermissionReply(asked["request_id"], True))
    assert (await running).text == "Edited src/app.py."


async def test_replies_that_arrive_out_of_order_are_kept_for_their_requests(tmp_path):
    j = job(tmp_path, "two-approvals")
    j.permission_replies.put_nowait(PermissionReply(f"{TURN}.1", True))  # the later request's answer comes first
    j.permission_replies.put_nowait(PermissionReply(f"{TURN}.0", True))
    emit = Recorder()
    result = await run(j, emit)
    assert result.outcome == "succeeded" and result.text == "Tests pass."
    assert [p["title"] for p in emit.of("permission")] == ["make", "git"]


async def test_deny_all_and_policy_allow_keep_codex_exec(tmp_path):
    for policy in ("deny-all", "policy-allow"):
        result = await run(job(tmp_path, "success", policy=policy), Recorder())
        assert result.outcome == "succeeded" and recorded(tmp_path, "argv.json")[0] == "exec"


async def test_an_approval_that_cannot_be_delivered_fails_the_run_at_once(tmp_path):
    j = job(tmp_path, "approval-exit")
    result = await run(j, Recorder())
    assert result.outcome == "failed"
    assert result.error == "approval reply could not be delivered: codex exited with code 1 while waiting for it"


async def test_a_question_over_the_app_server_emits_question_and_fails(tmp_path):
    emit = Recorder()
    result = await run(job(tmp_path, "question"), emit)
    assert emit.of("question") == [{"text": "Which database should I use?", "options": ["PostgreSQL", "SQLite"]}]
    assert emit.of("permission") == [] and result.outcome == "failed" and "question" in result.error


async def test_a_failed_turn_fails_with_codexs_message(tmp_path):
    result = await run(job(tmp_path, "failed"), Recorder())
    assert (result.outcome, result.error) == ("failed", "stream disconnected before completion: error sending request")


async def test_usage_keeps_only_known_metrics_of_the_runs_own_turn(tmp_path):
    emit = Recorder()
    result = await run(job(tmp_path, "usage-turns"), emit)
    assert result.outcome == "succeeded"
    assert [p["usage"] for p in emit.of("usage")] == [
        {"input_tokens": 500, "cached_input_tokens": 100, "output_tokens": 20, "reasoning_tokens": 7,
         "total_tokens": 520, "context_window": 272000},
        {"input_tokens": 800, "cached_input_tokens": 100, "reasoning_tokens": 7, "total_tokens": 820,
         "context_window": 272000}]


async def test_an_endless_network_wait_ends_the_run_naming_the_cause(tmp_path):
    emit = Recorder()
    result = await run(job(tmp_path, "unreachable"), emit)
    assert [s["text"] for s in emit.of("status")] == [
        f"engine retrying: attempt {n} of 3 (waiting for the network: Connection failed: error sending request)"
        for n in (1, 2, 3)]
    assert result.error == ("the model API was unreachable after 3 attempts; check the network and the credential "
                            "profile (codex: Connection failed: error sending request)")


async def test_a_codex_without_app_server_is_refused_before_launch_naming_the_fix(tmp_path):
    result = await run(job(tmp_path, "success", FAKE_CODEX_RELEASE="old"), Recorder())
    assert result.outcome == "failed"
    assert "needs `codex app-server`" in result.error and "npm install -g @openai/codex@latest" in result.error
    assert recorded(tmp_path, "stdin.jsonl") == []  # nothing was launched to take the prompt


async def test_an_exec_only_option_is_refused_before_launch_naming_it(tmp_path):
    result = await run(job(tmp_path, "success", extra=["--output-schema", "schema.json"]), Recorder())
    assert result.outcome == "failed" and "'--output-schema'" in result.error and "-c key=value" in result.error
    assert recorded(tmp_path, "argv.json") is None


# ---------------------------------------------------------------------------------------------- end to end

async def codex_host(hub, tmp_path: Path, scenario: str):
    """A runner offering the fake codex; the scenario reaches the child as the admin's credential."""
    from hub.runner.agent import Runner

    runner = Runner(hub.url, hub.admin_token, name="codex-host", slots=2,
                    **PROCESS_MODE, workspace_root=tmp_path / "ws",
                    engines={"codex": CodexEngine()})
    hub.runners.append((runner, asyncio.create_task(runner.run_forever())))
    await started(runner.registered.wait(), "the runner to register")
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    await hub.hub.credentials.declare(admin, "fake", ["FAKE_SCENARIO"])
    await hub.hub.credentials.set_value(admin, "fake", "FAKE_SCENARIO", scenario)


@pytest.mark.parametrize("answer_over", ["mcp", "rest"])
async def test_escalate_to_main_codex_waits_for_permission_respond_and_continues(hub, tmp_path, answer_over):
    import httpx2

    from tests.helpers import mcp_client

    await codex_host(hub, tmp_path, "approval")
    async with mcp_client(hub.url, hub.admin_token) as c:
        sub = await c.call_tool("task_submit", {"prompt": "run the tests", "profile": "codex",
                                                "permission_policy": "escalate-to-main", "credential_profile": "fake"})
        assert not sub.is_error, sub.content
        task_id, cursor, asked = sub.structured_content["task_id"], 0, None
        while asked is None:
            page = (await c.call_tool("task_wait",
                                      {"task_id": task_id, "cursor": cursor, "timeout_s": 10})).structured_content
            cursor = page["cursor"]
            asked = next((e for e in page["events"] if e["type"] == "permission"), None)
            assert page["status"] in ("queued", "dispatched", "running"), page
        assert (asked["tool"], asked["title"]) == ("command_execution", "pytest")
        if answer_over == "mcp":
            res = await c.call_tool("permission_respond", {"task_id": task_id, "request_id": asked["request_id"],
                                                           "allow": True})
            assert not res.is_error, res.content
        else:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {hub.admin_token}"}) as http:
                r = await http.post(f"{hub.url}/api/v1/tasks/{task_id}/permission",
                                    json={"request_id": asked["request_id"], "allow": True})
                assert r.status_code == 200, r.text
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    view = await hub.hub.tasks.wait_terminal(admin, task_id, timeout_s=30)
    assert (view["status"], view["result"]["text"]) == ("succeeded", "Tests pass."), view


async def test_a_steer_reaches_the_running_codex_turn_as_turn_steer(tmp_path):
    j = job(tmp_path, "steer")
    emit = Recorder()
    running = asyncio.ensure_future(run(j, emit))
    await emit.wait_for("tool")
    assert j.steer_into is not None
    assert await j.steer_into("use make test instead") is None
    result = await running
    assert (result.outcome, result.text) == ("succeeded", "Changing course: use make test instead")
    steer = [m for m in recorded(tmp_path, "stdin.jsonl") if m.get("method") == "turn/steer"]
    assert steer == [{"id": steer[0]["id"], "method": "turn/steer", "params": {
        "threadId": THREAD, "expectedTurnId": TURN,
        "input": [{"type": "text", "text": "use make test instead", "text_elements": []}]}}]
    assert j.steer_into is None
