"""Codex adapter: `codex exec --json`, one JSON event per stdout line.

Launch (the prompt goes to stdin; `-` tells codex to read it from there, so its length is not bound by argv):
    codex exec --json [--model M] [-c model_reasoning_effort=E] [<hub MCP>] <native_args> -
    codex exec --json [--model M] [-c model_reasoning_effort=E] [<hub MCP>] <native_args> resume THREAD_ID -
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

Approvals: `codex exec` resolves approval requests itself (it runs headless with approval_policy
forced to `never`) and its JSONL has no approval event, so there is no request to escalate and no
stdin channel to answer one; permission_policy acts through the launch flags alone.
"""
from __future__ import annotations

from typing import Any

from .base import CliEngine, Emit, EngineResult, Job
from .hubmcp import codex_overrides, session_endpoint
from .process import ChildProcess, run_child
from .streams import launch_value, mapped_usage, program_name

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
        argv += [str(a) for a in snap.get("native_args") or []]
        if thread:
            argv += ["resume", thread]
        return argv + ["-"]

    async def run(self, job: Job, emit: Emit) -> EngineResult:
        """Launch codex, hand it the prompt and read the thread to its end."""
        try:
            argv = self.argv(job)
        except ValueError as e:
            return EngineResult("failed", error=str(e))
        return await run_child(argv, cwd=job.workspace, env=job.env, stdin=True, name=self.name,
                               consume=lambda child: _CodexStream(job, emit, child).consume())


class _CodexStream:
    """One run's view of the thread: its id, the last agent message, tool statuses, the last error."""

    def __init__(self, job: Job, emit: Emit, child: ChildProcess) -> None:
        self.job, self.emit, self.child = job, emit, child
        self.thread_id: str | None = job.snapshot.get("resume_handle")
        self.text = ""
        self.error: str | None = None
        self.tool_status: dict[str, str] = {}

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
                self.error = _message(msg) or self.error
        return self._failed(self.error) if self.error else None

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
                await self.emit("tool", {"tool": {"id": item_id, "name": item_type, "title": _title(item), "status": status}})

    async def _question(self, questions: Any) -> EngineResult:
        qs = [q for q in questions or [] if isinstance(q, dict)]
        text = "\n".join(str(q.get("question") or q.get("header") or "") for q in qs)
        options = [str(o.get("label")) for q in qs for o in q.get("options") or [] if isinstance(o, dict)]
        await self.emit("question", {"text": text, "options": options})
        self.child.kill()  # it would wait for an answer that never comes
        return self._failed("codex asked the user a question")

    def _failed(self, error: str) -> EngineResult:
        return EngineResult("failed", text=self.text, error=error, resume_handle=self.thread_id)


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
