"""Claude, Codex and Pi adapters against fake CLIs: real executables that check argv and replay recorded streams."""
from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hub.domain.events import project
from hub.domain.policy import POLICIES, normalize_native_args
from hub.engines.base import EngineResult, Job, PermissionReply
from hub.engines.claude import ClaudeEngine
from hub.engines.codex import CodexEngine
from hub.engines.pi import PiEngine
from hub.engines.registry import ENGINES, default_engines
from hub.errors import Invalid
from tests.helpers import REPO

BIN = REPO / "tests" / "fakes" / "bin"
ADAPTERS = {"claude": ClaudeEngine, "codex": CodexEngine, "pi": PiEngine}
AS_ROOT = os.geteuid() == 0
FAST_S = 5.0  # "at once": far below the 30 s the fakes would otherwise sleep


@pytest.fixture(autouse=True)
def fake_clis(monkeypatch):
    """Point every adapter at its fake; no ambient IS_SANDBOX, so only the policy's env can supply it."""
    for name in ADAPTERS:
        monkeypatch.setenv(f"AMUX_{name.upper()}_BIN", str(BIN / name))
    monkeypatch.delenv("IS_SANDBOX", raising=False)


class Recorder:
    """The `emit` callback: keeps every event and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._changed = asyncio.Event()

    async def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        self.events.append((kind, payload))
        self._changed.set()

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [p for k, p in self.events if k == kind]

    async def first(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        async def wait() -> dict[str, Any]:
            while not self.of(kind):
                self._changed.clear()
                await self._changed.wait()
            return self.of(kind)[0]
        return await asyncio.wait_for(wait(), timeout)


@dataclass
class Launch:
    job: Job
    record: Path
    emit: Recorder = field(default_factory=Recorder)

    def recorded(self, name: str) -> Any:
        path = self.record / name
        if name.endswith(".jsonl"):
            return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return json.loads(path.read_text()) if path.exists() else None


def launch(engine: str, scenario: str, tmp_path: Path, *, policy: str = "policy-allow", extra: list[str] | None = None,
           model: str | None = None, effort: str | None = None, resume: str | None = None,
           prompt: str = "say hello") -> Launch:
    """Build the Job the runner would: native args normalized at admission, policy env merged into job.env."""
    native = normalize_native_args(engine, policy, extra or [], as_root=AS_ROOT)
    record, workspace = tmp_path / "record", tmp_path / "ws"
    record.mkdir(exist_ok=True)
    workspace.mkdir(exist_ok=True)
    snapshot = {"engine": engine, "model": model, "reasoning_effort": effort, "permission_policy": policy,
                "native_args": native.args, "resume_handle": resume, "timeout_s": 60}
    env = {**native.env, "FAKE_SCENARIO": scenario, "FAKE_RECORD_DIR": str(record)}
    return Launch(Job("task_1", 1, prompt, snapshot, workspace, env=env), record)


async def run(engine: str, ln: Launch) -> EngineResult:
    return await asyncio.wait_for(ADAPTERS[engine]().run(ln.job, ln.emit), 20)


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------------------------------------- argv per cell

CLAUDE_HEAD = ["-p", "--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
               "--model", "m-1", "--effort", "high"]
CODEX_HEAD = ["exec", "--json", "--model", "m-1", "-c", "model_reasoning_effort=high"]
EXTRA = {
    "claude": ["--dangerously-skip-permissions", "--add-dir", "extra", "--permission-mode", "plan"],
    "codex": ["--yolo", "--skip-git-repo-check", "-s", "workspace-write", "-c", "approval_policy=untrusted"],
    "pi": ["--tools", "read,bash"],
}
ARGV = {
    ("claude", "policy-allow"): CLAUDE_HEAD + ["--permission-mode", "bypassPermissions", "--add-dir", "extra"],
    ("claude", "escalate-to-main"): CLAUDE_HEAD + ["--permission-mode", "default", "--permission-prompt-tool", "stdio",
                                                   "--add-dir", "extra"],
    ("claude", "deny-all"): CLAUDE_HEAD + ["--permission-mode", "dontAsk", "--add-dir", "extra"],
    ("codex", "policy-allow"): CODEX_HEAD + ["--sandbox", "danger-full-access", "-c", "approval_policy=never",
                                             "--skip-git-repo-check", "-"],
    # escalate-to-main runs `codex app-server`: the policy's sandbox and approval policy are thread parameters,
    # the model a thread parameter and the effort a turn parameter (checked below), exec's git check has no form.
    ("codex", "escalate-to-main"): ["app-server"],
    ("codex", "deny-all"): CODEX_HEAD + ["--sandbox", "read-only", "-c", "approval_policy=never",
                                         "--skip-git-repo-check", "-"],
    ("pi", "policy-allow"): ["--mode", "rpc", "--model", "m-1", "--thinking", "high", "--tools", "read,bash"],
    ("pi", "escalate-to-main"): None,  # refused before launch
    ("pi", "deny-all"): None,
}


@pytest.mark.parametrize("engine,policy", sorted(ARGV))
async def test_each_engine_and_policy_cell_launches_the_cli_with_exactly_its_argv(engine, policy, tmp_path):
    expected = ARGV[(engine, policy)]
    if expected is None:
        with pytest.raises(Invalid, match="supports permission_policy policy-allow only"):
            launch(engine, "success", tmp_path, policy=policy, extra=EXTRA[engine])
        return
    ln = launch(engine, "success", tmp_path, policy=policy, extra=EXTRA[engine], model="m-1", effort="high")
    result = await run(engine, ln)
    assert ln.recorded("argv.json") == expected
    assert result.outcome == "succeeded", result.error
    if (engine, policy) == ("codex", "escalate-to-main"):
        assert ln.recorded("thread.json")["params"] == {"cwd": str(ln.job.workspace), "sandbox": "danger-full-access",
                                                        "approvalPolicy": "on-request", "model": "m-1"}
        assert ln.recorded("turn.json")["effort"] == "high"


@pytest.mark.skipif(not AS_ROOT, reason="the IS_SANDBOX rule applies to root only")
async def test_claude_bypass_as_root_runs_only_with_the_policy_env(tmp_path):
    ln = launch("claude", "success", tmp_path)
    assert ln.job.env["IS_SANDBOX"] == "1" and ln.recorded("env.json") is None
    assert (await run("claude", ln)).outcome == "succeeded"
    assert ln.recorded("env.json") == {"IS_SANDBOX": "1"}
    del ln.job.env["IS_SANDBOX"]
    result = await run("claude", ln)
    assert result.outcome == "failed" and "cannot be used with root/sudo privileges" in result.error


async def test_the_fake_clis_refuse_argv_the_adapter_would_never_build(tmp_path):
    ln = launch("claude", "success", tmp_path, extra=["--no-such-flag"])
    result = await run("claude", ln)
    assert result.outcome == "failed"
    assert "exited with code 64" in result.error and "unknown option '--no-such-flag'" in result.error


# ---------------------------------------------------------------------------------------------- plumbing

def test_available_means_the_binary_is_on_path(monkeypatch):
    for name, cls in ADAPTERS.items():
        monkeypatch.setenv(f"AMUX_{name.upper()}_BIN", f"amux-no-such-{name}")
        assert cls().available() is False
        monkeypatch.delenv(f"AMUX_{name.upper()}_BIN")
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")
    assert all(cls().available() for cls in ADAPTERS.values())


def test_the_registry_has_one_row_per_engine_including_scripted():
    assert list(ENGINES) == ["claude", "codex", "pi", "scripted"]
    assert {name: engine.name for name, engine in default_engines().items()} == {n: n for n in ENGINES}


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_the_prompt_reaches_the_cli_intact_even_when_it_looks_like_a_flag(engine, tmp_path):
    prompt = "--help me\nsecond line with 'quotes' and \"--yolo\""
    ln = launch(engine, "success", tmp_path, prompt=prompt)
    assert (await run(engine, ln)).outcome == "succeeded"
    if engine == "claude":
        sent = ln.recorded("stdin.jsonl")[1]
        assert sent == {"type": "user", "session_id": "", "parent_tool_use_id": None,
                        "message": {"role": "user", "content": prompt}}
    else:
        assert ln.recorded("prompt.json") == prompt


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_a_model_that_starts_with_a_dash_is_refused_before_launch(engine, tmp_path):
    ln = launch(engine, "success", tmp_path, model="--dangerously-skip-permissions")
    result = await run(engine, ln)
    assert result.outcome == "failed" and "starts with '-'" in result.error
    assert ln.recorded("argv.json") is None


# ---------------------------------------------------------------------------------------------- stream mapping

FINAL_TEXT = {"claude": "Hello from Claude.", "codex": "Hello from Codex.", "pi": "Hello from pi."}
HANDLE = {"claude": "0b6f8a52-6a3e-4f3b-9a1c-5d2e7c9f1a01", "codex": "0199a213-81c0-7800-8aa1-bbab2a035a53",
          "pi": "7f3c2a10-5b1e-4d8a-9c2f-3e4d5a6b7c8d"}


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_success_returns_the_final_text_and_records_the_provider_resume_handle(engine, tmp_path):
    ln = launch(engine, "success", tmp_path)
    result = await run(engine, ln)
    assert (result.outcome, result.text, result.resume_handle) == ("succeeded", FINAL_TEXT[engine], HANDLE[engine])
    assert ln.emit.of("text") == [{"text": FINAL_TEXT[engine]}]


RESUME_ARGV = {"claude": ["--resume", "prev-session"], "codex": ["resume", "prev-session", "-"],
               "pi": ["--session", "prev-session"]}


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_a_resume_handle_in_the_snapshot_resumes_that_provider_session(engine, tmp_path):
    ln = launch(engine, "success", tmp_path, resume="prev-session")
    result = await run(engine, ln)
    argv, want = ln.recorded("argv.json"), RESUME_ARGV[engine]
    assert any(argv[i:i + len(want)] == want for i in range(len(argv)))
    assert result.resume_handle == HANDLE[engine]  # what the provider reports wins


TOOLS = {
    "claude": [("toolu_01Bash", "Bash", "Fetch service status", "running"),
               ("toolu_01Bash", "Bash", "Fetch service status", "completed"),
               ("toolu_02Edit", "Edit", "src/app.py", "running"),
               ("toolu_02Edit", "Edit", "src/app.py", "failed")],
    "codex": [("item_0", "command_execution", "export", "running"),
              ("item_0", "command_execution", "export", "completed"),
              ("item_1", "file_change", "src/app.py", "completed"),
              ("item_2", "mcp_tool_call", "docs.search", "running"),
              ("item_2", "mcp_tool_call", "docs.search", "completed"),
              ("item_3", "command_execution", "pytest", "running"),
              ("item_3", "command_execution", "pytest", "failed")],
    "pi": [("call_bash1", "bash", "curl", "running"), ("call_bash1", "bash", "curl", "completed"),
           ("call_edit1", "edit", "src/app.py", "running"), ("call_edit1", "edit", "src/app.py", "failed")],
}


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_tool_task_events_carry_only_a_redacted_id_name_title_and_status(engine, tmp_path):
    ln = launch(engine, "tools", tmp_path)
    result = await run(engine, ln)
    tools = [project("tool", p) for p in ln.emit.of("tool")]
    assert all(set(p) == {"tool"} and set(p["tool"]) == {"id", "name", "title", "status"} for p in tools)
    assert [(t["tool"]["id"], t["tool"]["name"], t["tool"]["title"],
             t["tool"]["status"]) for t in tools] == TOOLS[engine]
    # Raw input, output and diffs never reach task events, and a failed tool does not fail the task.
    assert "SECRET" not in json.dumps([project(k, p) for k, p in ln.emit.events])
    assert result.outcome == "succeeded"


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_tool_events_bring_the_raw_input_and_output_for_the_agent_timeline(engine, tmp_path):
    ln = launch(engine, "tools", tmp_path)
    await run(engine, ln)
    raw = [p["tool"] for p in ln.emit.of("tool")]
    assert any(t.get("input") for t in raw) and any(t.get("output") for t in raw)
    assert "SECRET" in json.dumps(raw)  # what the agent really did, for the timeline (secrets are cut further on)


USAGE = {
    "claude": [{"input_tokens": 40, "output_tokens": 120, "cache_creation_input_tokens": 500,
                "cache_read_input_tokens": 3000}],
    "codex": [{"input_tokens": 24763, "cached_input_tokens": 24448, "output_tokens": 122}],
    "pi": [{"input_tokens": 200, "output_tokens": 20, "cache_read_input_tokens": 800,
            "cache_creation_input_tokens": 100,
            "total_tokens": 1120},
           {"input_tokens": 250, "output_tokens": 32, "cache_read_input_tokens": 1800,
            "cache_creation_input_tokens": 100,
            "total_tokens": 2182}],
}


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_usage_keeps_only_known_metrics_and_the_final_snapshot_is_the_runs_total(engine, tmp_path):
    ln = launch(engine, "usage", tmp_path)
    result = await run(engine, ln)
    assert [p["usage"] for p in ln.emit.of("usage")] == USAGE[engine]
    assert ln.emit.events[-1][0] in ("usage", "text")  # published before the run ends, never after
    assert result.outcome == "succeeded"


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_a_structured_question_emits_question_and_fails_without_picking_an_option(engine, tmp_path):
    ln = launch(engine, "question", tmp_path)
    started = time.monotonic()
    result = await run(engine, ln)
    assert time.monotonic() - started < FAST_S  # the fake would wait 30 s for an answer
    assert ln.emit.of("question") == [{"text": "Which database should I use?", "options": ["PostgreSQL", "SQLite"]}]
    assert ln.emit.of("permission") == []
    assert result.outcome == "failed" and "question" in result.error
    if engine == "claude":  # nothing was written back after the prompt: no option chosen
        assert [m["type"] for m in ln.recorded("stdin.jsonl")] == ["control_request", "user"]


@pytest.mark.parametrize("policy", POLICIES)
async def test_a_claude_question_is_never_an_approval_under_any_policy(policy, tmp_path):
    ln = launch("claude", "question", tmp_path, policy=policy)
    result = await run("claude", ln)
    assert len(ln.emit.of("question")) == 1 and ln.emit.of("permission") == []
    assert result.outcome == "failed"


FAILURE = {"claude": "claude ended with error_max_turns: Reached maximum number of turns (2)",
           "codex": "stream disconnected before completion: error sending request",
           "pi": "429 rate_limit_error: Number of request tokens has exceeded your per-minute rate limit"}


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_a_provider_failure_fails_with_the_providers_message(engine, tmp_path):
    result = await run(engine, ln := launch(engine, "failed", tmp_path))
    assert (result.outcome, result.error, result.resume_handle) == ("failed", FAILURE[engine], HANDLE[engine])
    assert ln.emit.of("question") == []


CRASH = {"claude": "Invalid API key · Please run /login",
         "codex": "Error: unexpected status 401 Unauthorized: Missing bearer or basic authentication in header",
         "pi": "No API key found for anthropic. Set ANTHROPIC_API_KEY or run pi and /login"}


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_a_crash_without_a_result_fails_with_the_exit_code_and_stderr_tail(engine, tmp_path):
    result = await run(engine, launch(engine, "crash", tmp_path))
    assert result.outcome == "failed"
    assert result.error == f"{engine} exited with code 1 without a result: {CRASH[engine]}"


GARBAGE_TEXT = {"claude": "Hello through the noise.", "codex": "Hello through the noise.", "pi": "Hello from pi."}


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_garbage_lines_on_stdout_are_ignored(engine, tmp_path):
    result = await run(engine, ln := launch(engine, "garbage", tmp_path))
    assert (result.outcome, result.text) == ("succeeded", GARBAGE_TEXT[engine])
    assert {k for k, _ in ln.emit.events} <= {"text", "usage"}


@pytest.mark.parametrize("engine", ADAPTERS)
async def test_cancellation_kills_the_cli_and_everything_it_started(engine, tmp_path):
    ln = launch(engine, "slow", tmp_path)
    task = asyncio.create_task(ADAPTERS[engine]().run(ln.job, ln.emit))
    await until(lambda: ln.recorded("grandchild.json") is not None)
    pids = [ln.recorded("pid.json"), ln.recorded("grandchild.json")]
    assert all(alive(pid) for pid in pids)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: not any(alive(pid) for pid in pids), timeout=FAST_S)


# ---------------------------------------------------------------------------------------------- approvals (Claude)

REQUEST = {"request_id": "req_1_perm", "tool": "Bash", "title": "Remove the build directory"}
RM_INPUT = {"command": "rm -rf build", "description": "Remove the build directory"}


def control_responses(ln: Launch) -> list[dict[str, Any]]:
    return [m["response"] for m in ln.recorded("stdin.jsonl") if m.get("type") == "control_response"]


async def test_an_escalated_request_waits_for_the_main_session_and_delivers_allow(tmp_path):
    ln = launch("claude", "permission", tmp_path, policy="escalate-to-main")
    task = asyncio.create_task(run("claude", ln))
    assert await ln.emit.first("permission") == REQUEST
    await asyncio.sleep(0.2)
    assert not task.done()  # nothing proceeds without an answer
    ln.job.permission_replies.put_nowait(PermissionReply("req_1_perm", True))
    result = await task
    assert control_responses(ln) == [{"subtype": "success", "request_id": "req_1_perm",
                                      "response": {"behavior": "allow", "updatedInput": RM_INPUT}}]
    assert (result.outcome, result.text) == ("succeeded", "Removed the build directory.")


async def test_an_escalated_request_delivers_deny_with_the_callers_message(tmp_path):
    ln = launch("claude", "permission", tmp_path, policy="escalate-to-main")
    task = asyncio.create_task(run("claude", ln))
    await ln.emit.first("permission")
    ln.job.permission_replies.put_nowait(PermissionReply("req_1_perm", False, "not on a Friday"))
    result = await task
    assert control_responses(ln) == [{"subtype": "success", "request_id": "req_1_perm",
                                      "response": {"behavior": "deny", "message": "not on a Friday"}}]
    assert result.text == "I was not allowed to remove the build directory."
    assert ln.emit.of("tool")[-1]["tool"]["status"] == "failed"


async def test_a_reply_for_another_request_does_not_answer_this_one(tmp_path):
    ln = launch("claude", "permission", tmp_path, policy="escalate-to-main")
    task = asyncio.create_task(run("claude", ln))
    await ln.emit.first("permission")
    ln.job.permission_replies.put_nowait(PermissionReply("req_other", True))
    await asyncio.sleep(0.2)
    assert not task.done() and control_responses(ln) == []
    ln.job.permission_replies.put_nowait(PermissionReply("req_1_perm", False, "no"))
    assert (await task).outcome == "succeeded"
    assert control_responses(ln)[0]["response"]["behavior"] == "deny"


async def test_deny_all_rejects_approval_requests_without_asking(tmp_path):
    ln = launch("claude", "permission", tmp_path, policy="deny-all")
    result = await run("claude", ln)
    assert ln.emit.of("permission") == []
    assert control_responses(ln) == [{"subtype": "success", "request_id": "req_1_perm", "response": {
        "behavior": "deny", "message": "denied by permission_policy deny-all"}}]
    assert result.text == "I was not allowed to remove the build directory."


async def test_policy_allow_allows_a_stray_approval_request_without_asking(tmp_path):
    ln = launch("claude", "permission", tmp_path, policy="policy-allow")
    result = await run("claude", ln)
    assert ln.emit.of("permission") == []
    assert control_responses(ln)[0]["response"] == {"behavior": "allow", "updatedInput": RM_INPUT}
    assert result.text == "Removed the build directory."


async def test_an_approval_reply_that_cannot_be_delivered_fails_at_once(tmp_path):
    ln = launch("claude", "permission-gone", tmp_path, policy="escalate-to-main")
    task = asyncio.create_task(run("claude", ln))
    await ln.emit.first("permission")
    await asyncio.sleep(0.1)  # the CLI has closed its stdin by now
    started = time.monotonic()
    ln.job.permission_replies.put_nowait(PermissionReply("req_2_gone", True))
    result = await task
    assert time.monotonic() - started < FAST_S  # not the 30 s the CLI would keep running
    assert result.outcome == "failed" and result.error.startswith("approval reply could not be delivered: claude stdin")


async def test_an_engine_that_exits_while_awaiting_approval_fails_at_once_without_a_reply(tmp_path):
    ln = launch("claude", "permission-exit", tmp_path, policy="escalate-to-main")
    started = time.monotonic()
    result = await run("claude", ln)
    assert time.monotonic() - started < FAST_S
    assert ln.emit.of("permission") == [{"request_id": "req_3_exit", "tool": "Bash",
                                         "title": "Remove the build directory"}]
    assert result.outcome == "failed"
    assert result.error == "approval reply could not be delivered: claude exited with code 1 while waiting for it"


async def test_stdin_is_closed_after_the_result_so_claude_exits(tmp_path):
    ln = launch("claude", "success", tmp_path)
    assert (await run("claude", ln)).outcome == "succeeded"
    assert not alive(ln.recorded("pid.json"))
    assert [m["type"] for m in ln.recorded("stdin.jsonl")] == ["control_request", "user"]


# ---------------------------------------------------------------------------------------------- steering mid-turn

STEER_SCENARIO = {"claude": "steer-mid-tool", "pi": "steer"}


async def steer_when_running(ln: Launch, text: str) -> str | None:
    """Wait for the turn's first tool call (the fake then waits for input), then steer through the job."""
    await ln.emit.first("tool")
    await until(lambda: ln.job.steer_into is not None)
    assert ln.job.steer_into is not None
    return await ln.job.steer_into(text)


@pytest.mark.parametrize("engine", sorted(STEER_SCENARIO))
async def test_a_steer_reaches_the_running_turn_through_the_engines_own_protocol(engine, tmp_path):
    ln = launch(engine, STEER_SCENARIO[engine], tmp_path)
    running = asyncio.ensure_future(run(engine, ln))
    assert await steer_when_running(ln, "stop building; run make test instead") is None
    result = await running
    assert (result.outcome, result.text) == ("succeeded", "Changing course: stop building; run make test instead")
    sent = ln.recorded("stdin.jsonl")
    if engine == "claude":  # one more stream-json user line, written while the turn ran
        assert sent[2] == {"type": "user", "session_id": "", "parent_tool_use_id": None,
                           "message": {"role": "user", "content": "stop building; run make test instead"}}
    else:  # pi's RPC `steer` command
        assert {"id": "amux-steer-1", "type": "steer", "message": "stop building; run make test instead"} in sent
    assert ln.job.steer_into is None  # the turn is over: nothing more reaches it


async def test_a_claude_steer_after_the_last_tool_call_is_answered_as_its_own_turn_before_the_run_ends(tmp_path):
    ln = launch("claude", "steer-after-text", tmp_path)
    running = asyncio.ensure_future(run("claude", ln))
    await until(lambda: ln.job.steer_into is not None)
    assert await ln.job.steer_into("also add a summary") is None
    result = await running
    # Claude's first `result` came before any tool boundary took the line; the run waits for the one answering it.
    assert (result.outcome, result.text) == ("succeeded", "Changing course: also add a summary")


async def test_codex_exec_answers_why_it_takes_no_steering(tmp_path):
    engine = CodexEngine()
    assert "codex exec" in (engine.steering_refusal({"permission_policy": "policy-allow"}) or "")
    assert engine.steering_refusal({"permission_policy": "escalate-to-main"}) is None
    assert ClaudeEngine().steering_refusal({}) is None and PiEngine().steering_refusal({}) is None
