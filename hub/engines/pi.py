"""Pi adapter: `pi --mode json`, every agent session event as one JSON line.

Launch (`--` ends option parsing, so a prompt that starts with '-' stays a prompt):
    pi --mode json [--model M] [--thinking E] [--session SESSION_ID] <native_args> -- PROMPT

Stdout → canonical events (packages/coding-agent/docs/json.md and rpc.md in badlogic/pi-mono):
    session {id}                                 → resume handle (first line)
    message_end, assistant message               → `text`; its usage is added to the run's
                                                   cumulative `usage` (input/output/cacheRead/cacheWrite/totalTokens)
    tool_execution_start / tool_execution_end    → `tool` running / completed or failed (isError)
    extension_ui_request select/input/editor/confirm → `question`, then the run fails
    agent_end                                    → succeeded, or failed when the last assistant
                                                   message stopped with `error` / `aborted`

Pi has no permission prompts: it supports permission_policy policy-allow only.
Pi has no MCP client either (by design): a Session Turn reaches the hub through the `amux` CLI on its
PATH, with the AMUX_HUB_URL and AMUX_TOKEN of its environment (see hubmcp.py).
"""
from __future__ import annotations

from typing import Any

from .base import CliEngine, Emit, EngineResult, Job
from .process import ChildProcess, run_child
from .streams import launch_value, mapped_usage, tool_title

USAGE_NAMES = {"input": "input_tokens", "output": "output_tokens", "cacheRead": "cache_read_input_tokens",
               "cacheWrite": "cache_creation_input_tokens", "totalTokens": "total_tokens"}
DIALOGS = frozenset({"select", "input", "editor", "confirm"})


class PiEngine(CliEngine):
    """Run pi in JSON mode and translate its session events."""

    name = "pi"
    config_dirs = (("PI_CODING_AGENT_DIR", ".pi/agent"),)

    def argv(self, job: Job) -> list[str]:
        """Build the command line from the frozen snapshot."""
        snap = job.snapshot
        argv = [self.binary(), "--mode", "json"]
        for flag, key in (("--model", "model"), ("--thinking", "reasoning_effort"), ("--session", "resume_handle")):
            value = launch_value(snap, key)
            if value is not None:
                argv += [flag, value]
        return argv + [str(a) for a in snap.get("native_args") or []] + ["--", job.prompt]

    async def run(self, job: Job, emit: Emit) -> EngineResult:
        """Launch pi and read its session to agent_end."""
        try:
            argv = self.argv(job)
        except ValueError as e:
            return EngineResult("failed", error=str(e))
        return await run_child(argv, cwd=job.workspace, env=job.env, stdin=False, name=self.name,
                               boundary=job.boundary,
                               consume=lambda child: _PiStream(job, emit, child).consume())


class _PiStream:
    """One run's view of the session: its id, cumulative usage, open tools, the last assistant message."""

    def __init__(self, job: Job, emit: Emit, child: ChildProcess) -> None:
        self.emit, self.child = emit, child
        self.session_id: str | None = job.snapshot.get("resume_handle")
        self.usage: dict[str, int] = {}
        self.tools: dict[str, tuple[str, str]] = {}
        self.text = ""
        self.stop: tuple[str, str] = ("", "")
        self.retry_error: str | None = None

    async def consume(self) -> EngineResult | None:
        async for msg in self.child.messages():
            kind = msg.get("type")
            if kind == "session" and isinstance(msg.get("id"), str):
                self.session_id = msg["id"]
            elif kind == "message_end" and isinstance(msg.get("message"), dict):
                await self._message(msg["message"])
            elif kind == "tool_execution_start":
                tool_id, name = str(msg.get("toolCallId") or ""), str(msg.get("toolName") or "")
                self.tools[tool_id] = (name, tool_title(name, msg.get("args")))
                await self._tool(tool_id, "running")
            elif kind == "tool_execution_end":
                tool_id = str(msg.get("toolCallId") or "")
                self.tools.setdefault(tool_id, (str(msg.get("toolName") or ""), str(msg.get("toolName") or "")))
                await self._tool(tool_id, "failed" if msg.get("isError") else "completed")
            elif kind == "extension_ui_request" and msg.get("method") in DIALOGS:
                return await self._question(msg)
            elif kind == "auto_retry_end" and msg.get("success") is False:
                self.retry_error = str(msg.get("finalError") or "retries exhausted")
            elif kind == "agent_end":
                return self._end()
        return None

    async def _message(self, message: dict[str, Any]) -> None:
        if message.get("role") != "assistant":
            return
        content = message.get("content")
        texts = [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
                 and isinstance(b.get("text"), str)] if isinstance(content, list) else []
        text = "".join(texts)
        if text:
            self.text = text
            await self.emit("text", {"text": text})
        step = mapped_usage(message.get("usage"), USAGE_NAMES)
        if step:  # each assistant message reports one request; the run's usage is their sum
            for k, v in step.items():
                self.usage[k] = self.usage.get(k, 0) + v
            await self.emit("usage", {"usage": dict(self.usage)})
        self.stop = (str(message.get("stopReason") or ""), str(message.get("errorMessage") or ""))

    async def _tool(self, tool_id: str, status: str) -> None:
        name, title = self.tools[tool_id]
        await self.emit("tool", {"tool": {"id": tool_id, "name": name, "title": title, "status": status}})

    async def _question(self, msg: dict[str, Any]) -> EngineResult:
        text = "\n".join(str(msg[k]) for k in ("title", "message") if msg.get(k))
        options = [str(o) for o in msg.get("options") or []]
        await self.emit("question", {"text": text, "options": options})
        self.child.kill()  # it would wait for an answer that never comes
        return EngineResult("failed", text=self.text, error="pi asked the user a question",
                            resume_handle=self.session_id)

    def _end(self) -> EngineResult:
        reason, message = self.stop
        if reason in ("error", "aborted") or self.retry_error:
            error = message or self.retry_error or f"pi stopped: {reason}"
            return EngineResult("failed", text=self.text, error=error, resume_handle=self.session_id)
        return EngineResult("succeeded", text=self.text, resume_handle=self.session_id)
