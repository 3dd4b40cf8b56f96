"""Codex adapter: `codex exec --json`, one JSON event per stdout line.

Launch (the prompt goes to stdin; `-` tells codex to read it from there, so its length is not bound by argv):
    codex exec --json [--model M] [-c model_reasoning_effort=E] [<hub MCP>] [--skip-git-repo-check] <native_args> -
    codex exec --json [--model M] [-c model_reasoning_effort=E] [<hub MCP>] [--skip-git-repo-check] <native_args>
               resume THREAD_ID -
(`--skip-git-repo-check` unless native_args has it: an amux workspace is no git checkout, and codex exec
refuses to run outside one without it.)
where <hub MCP>, for a Session Turn only, is `-c mcp_servers.amux.url="<hub>/mcp"
-c mcp_servers.amux.bearer_token_env_var="AMUX_TOKEN"` (see hubmcp.py).

Stdout → canonical events (event types from codex-rs/exec/src/exec_events.rs):
    thread.started {thread_id}                  → resume handle
    item.* agent_message (completed)            → `text`; the last one is the final text
    item.* command_execution / file_change / mcp_tool_call / web_search / collab_tool_call
                                                → `tool` (item id, item type, short title, status)
    request_user_input {questions}              → `question`, then the run fails
    turn.completed {usage}                      → final `usage`, succeeded
    turn.failed {error} / error {message}       → failed
    error "Reconnecting... N/M (cause)"          → `status` "engine retrying: attempt N of M (cause)"
    error "Reconnecting... waiting for network"  → `status`; the third ends the run: "the model API was
                                                   unreachable after 3 attempts; …" (codex would wait forever)

Approvals: `codex exec` resolves approval requests itself (it runs headless with approval_policy
forced to `never`) and its JSONL has no approval event. So under escalate-to-main the adapter drives
`codex app-server` instead (codex_app.py), whose approval requests become `permission` events; a codex
without `app-server` fails the run before launch, naming the upgrade. policy-allow and deny-all keep
`codex exec` and act through the launch flags alone.
"""
from __future__ import annotations

import re
from typing import Any

from .base import CliEngine, Emit, EngineResult, Job
from .codex_app import AppServerRun, app_server_launch, has_app_server
from .hubmcp import codex_overrides, session_endpoint
from .process import ChildProcess, run_child
from .streams import launch_value, mapped_usage, program_name, raw_tool

TRUST_WORKSPACE = "--skip-git-repo-check"
NO_APP_SERVER = ("permission_policy escalate-to-main needs `codex app-server`, which {binary} does not have; "
                 "upgrade Codex on this runner (npm install -g @openai/codex@latest) or choose "
                 "policy-allow or deny-all")
USAGE_NAMES = {"reasoning_output_tokens": "reasoning_tokens"}
TOOL_ITEMS = frozenset({"command_execution", "file_change", "mcp_tool_call", "web_search", "collab_tool_call"})
STATUSES = {"in_progress": "running", "completed": "completed", "failed": "failed", "declined": "failed"}


class CodexEngine(CliEngine):
    """Run `codex exec --json` and translate its thread events."""

    name = "codex"
    config_dirs = (("CODEX_HOME", ".codex"),)

    def argv(self, job: Job) -> list[str]:
        """Build the command line from the frozen snapshot."""
        snap = job.snapshot
        argv = [self.binary(), "exec", "--json"]
        model, effort, thread = (launch_value(snap, k) for k in ("model", "reasoning_effort", "resume_handle"))
        if model:
            argv += ["--model", model]
        if effort:
            argv += ["-c", f"model_reasoning_effort={effort}"]
        endpoint = session_endpoint(job.env)
        if endpoint is not None:  # a Session Turn: the hub's MCP tools; a task child gets none
            argv += codex_overrides(endpoint)
        native = [str(a) for a in snap.get("native_args") or []]
        if TRUST_WORKSPACE not in native:  # the runner made the workspace; codex exec refuses one outside git
            argv.append(TRUST_WORKSPACE)
        argv += native
        if thread:
            argv += ["resume", thread]
        return argv + ["-"]

    def app_server_argv(self, job: Job) -> tuple[list[str], dict[str, str]]:
        """Build `codex app-server` argv and the thread parameters (escalate-to-main; see codex_app.py)."""
        for key in ("model", "reasoning_effort", "resume_handle"):
            launch_value(job.snapshot, key)  # the same refusal as exec: a value that would read as an option
        options, thread = app_server_launch([str(a) for a in job.snapshot.get("native_args") or []])
        argv = [self.binary(), "app-server"]
        endpoint = session_endpoint(job.env)
        if endpoint is not None:
            argv += codex_overrides(endpoint)
        return argv + options, thread

    def steering_refusal(self, snapshot: dict[str, Any]) -> str | None:
        """None under escalate-to-main (`codex app-server` takes `turn/steer`); `codex exec` reads its prompt once."""
        if snapshot.get("permission_policy") == "escalate-to-main":
            return None
        return ("codex exec reads its whole prompt before the turn starts and takes no input during it (only "
                "`codex app-server`, used under permission_policy escalate-to-main, takes turn/steer); the "
                "correction waits for the next prompt")

    async def run(self, job: Job, emit: Emit) -> EngineResult:
        """Launch codex, hand it the prompt and read the thread to its end."""
        if job.snapshot.get("permission_policy") == "escalate-to-main":
            return await self._run_app_server(job, emit)
        try:
            argv = self.argv(job)
        except ValueError as e:
            return EngineResult("failed", error=str(e))
        return await run_child(argv, cwd=job.workspace, env=job.env, stdin=True, name=self.name,
                               boundary=job.boundary, confine=job.confine,
                               consume=lambda child: _CodexStream(job, emit, child).consume())

    async def _run_app_server(self, job: Job, emit: Emit) -> EngineResult:
        """Escalate-to-main: drive `codex app-server`, whose approval requests reach the main session."""
        try:
            argv, thread = self.app_server_argv(job)
        except ValueError as e:
            return EngineResult("failed", error=str(e))
        if not await has_app_server(self.binary(), job.env):
            return EngineResult("failed", error=NO_APP_SERVER.format(binary=self.binary()))
        return await run_child(argv, cwd=job.workspace, env=job.env, stdin=True, name=self.name,
                               boundary=job.boundary, confine=job.confine,
                               consume=lambda child: AppServerRun(job, emit, child, thread, Retries()).consume())


class _CodexStream:
    """One run's view of the thread: its id, the last agent message, tool statuses, the last error."""

    def __init__(self, job: Job, emit: Emit, child: ChildProcess) -> None:
        self.job, self.emit, self.child = job, emit, child
        self.thread_id: str | None = job.snapshot.get("resume_handle")
        self.text = ""
        self.error: str | None = None
        self.tool_status: dict[str, str] = {}
        self.retries = Retries()

    async def consume(self) -> EngineResult | None:
        # The prompt is all of stdin: codex reads it to EOF before it starts the turn.
        if await self.child.send_text(self.job.prompt):
            return None
        async for msg in self.child.messages():
            kind = msg.get("type")
            if kind == "thread.started" and isinstance(msg.get("thread_id"), str):
                self.thread_id = msg["thread_id"]
            elif kind in ("item.started", "item.updated", "item.completed") and isinstance(msg.get("item"), dict):
                await self._item(kind, msg["item"])
            elif kind == "request_user_input":
                return await self._question(msg.get("questions"))
            elif kind == "turn.completed":
                usage = mapped_usage(msg.get("usage"), USAGE_NAMES)
                if usage:
                    await self.emit("usage", {"usage": usage})
                return EngineResult("succeeded", text=self.text, resume_handle=self.thread_id)
            elif kind == "turn.failed":
                return self._failed(_message(msg.get("error")) or "codex turn failed")
            elif kind == "error":
                message = _message(msg)
                self.error = message or self.error
                ended = await self._retrying(message) if message else None
                if ended:
                    return ended
        return self._failed(self.error) if self.error else None

    async def _retrying(self, message: str) -> EngineResult | None:
        """Report codex's reconnects as status events; end the run when retrying cannot help."""
        status, failure = self.retries.read(message)
        if status is not None:
            await self.emit("status", status)
        if failure is not None:
            self.child.kill()  # codex would keep trying (a network wait has no end of its own)
            return self._failed(failure)
        return None

    async def _item(self, kind: str, item: dict[str, Any]) -> None:
        item_type = item.get("type")
        if item_type == "agent_message" and kind == "item.completed" and isinstance(item.get("text"), str):
            self.text = item["text"]
            await self.emit("text", {"text": item["text"]})
        elif item_type in TOOL_ITEMS:
            item_id = str(item.get("id") or "")
            default = "completed" if kind == "item.completed" else "running"
            status = STATUSES.get(str(item.get("status")), default)
            if self.tool_status.get(item_id) != status:
                self.tool_status[item_id] = status
                await self.emit("tool", raw_tool({"id": item_id, "name": item_type, "title": _title(item),
                                                  "status": status}, **_raw(item)))

    async def _question(self, questions: Any) -> EngineResult:
        qs = [q for q in questions or [] if isinstance(q, dict)]
        text = "\n".join(str(q.get("question") or q.get("header") or "") for q in qs)
        options = [str(o.get("label")) for q in qs for o in q.get("options") or [] if isinstance(o, dict)]
        await self.emit("question", {"text": text, "options": options})
        self.child.kill()  # it would wait for an answer that never comes
        return self._failed("codex asked the user a question")

    def _failed(self, error: str) -> EngineResult:
        return EngineResult("failed", text=self.text, error=error, resume_handle=self.thread_id)


RECONNECT = re.compile(r"^Reconnecting\.\.\. (\d+)/(\d+)(?: \((.*)\))?$", re.DOTALL)
NETWORK_WAIT = re.compile(r"^Reconnecting\.\.\. waiting for network(?: \((.*)\))?$", re.DOTALL)
REJECTED = re.compile(r"\b(401 Unauthorized|403 Forbidden)\b")
NETWORK_WAITS = 3  # codex waits for the network without end (5 s, 10 s, 20 s … apart); amux gives up at the third


class Retries:
    """Codex's reconnect messages (`error` events) read as retries: status events, and when to give up.

    `Reconnecting... N/M (cause)` is a bounded retry; `Reconnecting... waiting for network (cause)` an
    unbounded one (codex's `unbounded_connection_retries`), which amux ends at its NETWORK_WAITS-th report.
    A credential rejected twice in a row (HTTP 401/403) ends the run at once with codex's own message.
    """

    def __init__(self) -> None:
        self.waits = 0

    def read(self, message: str) -> tuple[dict[str, Any] | None, str | None]:
        """Return (status event payload or None, failure or None) for one codex error message."""
        bounded, wait = RECONNECT.match(message), NETWORK_WAIT.match(message)
        if bounded:
            attempt, total, cause = int(bounded[1]), int(bounded[2]), bounded[3] or "stream error"
            status = _retry_status(attempt, total, cause)
            if REJECTED.search(cause) and attempt >= 2:
                return status, f"the model API rejected the credential; fix the credential profile (codex: {cause})"
            return status, None
        if wait:
            self.waits += 1
            cause = wait[1] or "connection failed"
            status = _retry_status(self.waits, NETWORK_WAITS, f"waiting for the network: {cause}")
            if self.waits >= NETWORK_WAITS:
                return status, (f"the model API was unreachable after {self.waits} attempts; check the network and the "
                                f"credential profile (codex: {cause})")
            return status, None
        return None, None


def _retry_status(attempt: int, total: int, cause: str) -> dict[str, Any]:
    return {"text": f"engine retrying: attempt {attempt} of {total} ({cause})",
            "retry": {"attempt": attempt, "max_retries": total, "cause": cause}}


def _title(item: dict[str, Any]) -> str:
    kind = item.get("type")
    if kind == "command_execution":
        return program_name(item.get("command")) or "command"
    if kind == "file_change":
        return ", ".join(str(c.get("path")) for c in item.get("changes") or [] if isinstance(c, dict)) or "file change"
    if kind == "mcp_tool_call":
        return f"{item.get('server')}.{item.get('tool')}"
    if kind == "collab_tool_call":
        return str(item.get("tool") or "collab")
    return "web search"


def _message(obj: Any) -> str | None:
    return str(obj["message"]) if isinstance(obj, dict) and obj.get("message") else None


def _raw(item: dict[str, Any]) -> dict[str, Any]:
    """Return an item's raw input, output, diff and locations (`codex exec` names them in snake_case)."""
    changes = [c for c in item.get("changes") or [] if isinstance(c, dict)]
    return {"input": item.get("command") or item.get("arguments") or item.get("query"),
            "output": item.get("aggregated_output") or item.get("result") or item.get("error"),
            "diff": [c for c in changes if c.get("diff")] or None,
            "locations": [str(c.get("path")) for c in changes if c.get("path")]}
