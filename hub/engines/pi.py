"""Pi adapter: `pi --mode rpc`, JSON commands on stdin, every agent session event as one JSON line on stdout.

Launch (the prompt is a command on stdin, never in argv):
    pi --mode rpc [--model M] [--thinking E] [--session SESSION_ID] <native_args>

Stdin (packages/coding-agent/docs/rpc.md in badlogic/pi-mono), one command a line:
    {"id":"amux-state","type":"get_state"}          → response data.sessionId: the resume handle
    {"id":"amux-prompt","type":"prompt","message":PROMPT}
    {"id":"amux-steer-N","type":"steer","message":TEXT}  while the agent runs (instance_steer): pi delivers it
                                                   after the current tool execution and skips the remaining tools
Stdin is closed after agent_end, which lets pi exit.

Stdout → canonical events (docs/json.md and rpc.md):
    response {id, command, success, error?}      → the answer to one of our commands (a refused prompt fails)
    message_end, assistant message               → `text`; its usage is added to the run's
                                                   cumulative `usage` (input/output/cacheRead/cacheWrite/totalTokens)
    tool_execution_start / tool_execution_end    → `tool` running / completed or failed (isError), with the
                                                   raw args and result for the Agent Timeline
    extension_ui_request select/input/editor/confirm → `question`, then the run fails
    agent_end                                    → succeeded, or failed when the last assistant
                                                   message stopped with `error` / `aborted`

Pi has no permission prompts: it supports permission_policy policy-allow only.
Pi has no MCP client either (by design): a Session Turn reaches the hub through the `amux` CLI on its
PATH, with the AMUX_HUB_URL and AMUX_TOKEN of its environment (see hubmcp.py).
"""
from __future__ import annotations

import asyncio
from typing import Any

from .base import CliEngine, Emit, EngineResult, Job
from .process import ChildProcess, run_child
from .streams import launch_value, mapped_usage, raw_tool, tool_locations, tool_title

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
        argv = [self.binary(), "--mode", "rpc"]
        for flag, key in (("--model", "model"), ("--thinking", "reasoning_effort"), ("--session", "resume_handle")):
            value = launch_value(snap, key)
            if value is not None:
                argv += [flag, value]
        return argv + [str(a) for a in snap.get("native_args") or []]

    def steering_refusal(self, snapshot: dict[str, Any]) -> str | None:
        """None: RPC mode takes a `steer` command while the agent runs."""
        return None

    async def run(self, job: Job, emit: Emit) -> EngineResult:
        """Launch pi and read its session to agent_end."""
        try:
            argv = self.argv(job)
        except ValueError as e:
            return EngineResult("failed", error=str(e))
        return await run_child(argv, cwd=job.workspace, env=job.env, stdin=True, name=self.name,
                               boundary=job.boundary, confine=job.confine,
                               consume=lambda child: _PiStream(job, emit, child).consume())


class _PiStream:
    """One run's view of the session: its id, cumulative usage, open tools, the last assistant message."""

    def __init__(self, job: Job, emit: Emit, child: ChildProcess) -> None:
        self.job, self.emit, self.child = job, emit, child
        self.answers: dict[str, asyncio.Future[dict[str, Any]]] = {}  # steer commands waiting for their response
        self.steers = 0
        self.session_id: str | None = job.snapshot.get("resume_handle")
        self.usage: dict[str, int] = {}
        self.tools: dict[str, tuple[str, str]] = {}
        self.text = ""
        self.stop: tuple[str, str] = ("", "")
        self.retry_error: str | None = None

    async def consume(self) -> EngineResult | None:
        if (await self.child.send({"id": "amux-state", "type": "get_state"})
                or await self.child.send({"id": "amux-prompt", "type": "prompt", "message": self.job.prompt})):
            return None  # it died on launch: reported with its exit code and stderr
        try:
            return await self._read()
        finally:
            self.job.steer_into = None
            for answer in self.answers.values():
                if not answer.done():
                    answer.set_result({"success": False, "error": "the run ended"})

    async def _steer(self, text: str) -> str | None:
        """Send a `steer` command while the agent runs; None once pi answered success, else its error."""
        self.steers += 1
        rid = f"amux-steer-{self.steers}"
        answer = asyncio.get_running_loop().create_future()
        self.answers[rid] = answer
        failure = await self.child.send({"id": rid, "type": "steer", "message": text})
        if failure:
            self.answers.pop(rid, None)
            return f"pi's stdin could not take the correction: {failure}"
        reply = await answer
        self.answers.pop(rid, None)
        return None if reply.get("success") else f"pi refused the steer: {reply.get('error') or 'no reason given'}"

    async def _response(self, msg: dict[str, Any]) -> EngineResult | None:
        rid = str(msg.get("id") or "")
        if rid == "amux-state" and isinstance((msg.get("data") or {}).get("sessionId"), str):
            self.session_id = msg["data"]["sessionId"]
        elif rid == "amux-prompt" and not msg.get("success"):
            return EngineResult("failed", error=f"pi refused the prompt: {msg.get('error') or 'no reason given'}",
                                resume_handle=self.session_id)
        elif rid in self.answers and not self.answers[rid].done():
            self.answers[rid].set_result(msg)
        return None

    async def _read(self) -> EngineResult | None:
        async for msg in self.child.messages():
            kind = msg.get("type")
            if kind == "response":
                ended = await self._response(msg)
                if ended:
                    return ended
            elif kind == "agent_start":
                self.job.steer_into = self._steer
            elif kind == "session" and isinstance(msg.get("id"), str):
                self.session_id = msg["id"]
            elif kind == "message_end" and isinstance(msg.get("message"), dict):
                await self._message(msg["message"])
            elif kind == "tool_execution_start":
                tool_id, name, args = str(msg.get("toolCallId") or ""), str(msg.get("toolName") or ""), msg.get("args")
                self.tools[tool_id] = (name, tool_title(name, args))
                diff = ({"old": args.get("oldText") or "", "new": args.get("newText") or ""}
                        if isinstance(args, dict) and ("oldText" in args or "newText" in args) else None)
                await self._tool(tool_id, "running", input=args, locations=tool_locations(args), diff=diff)
            elif kind == "tool_execution_end":
                tool_id = str(msg.get("toolCallId") or "")
                self.tools.setdefault(tool_id, (str(msg.get("toolName") or ""), str(msg.get("toolName") or "")))
                await self._tool(tool_id, "failed" if msg.get("isError") else "completed", output=msg.get("result"))
            elif kind == "extension_ui_request" and msg.get("method") in DIALOGS:
                return await self._question(msg)
            elif kind == "auto_retry_end" and msg.get("success") is False:
                self.retry_error = str(msg.get("finalError") or "retries exhausted")
            elif kind == "agent_end":
                self.job.steer_into = None
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

    async def _tool(self, tool_id: str, status: str, **raw: Any) -> None:
        name, title = self.tools[tool_id]
        await self.emit("tool", raw_tool({"id": tool_id, "name": name, "title": title, "status": status}, **raw))

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
