"""Claude Code adapter: `claude -p` speaking stream-json on stdout and stdin.

Launch (prompt on stdin, never in argv):
    claude -p --output-format stream-json --verbose --input-format stream-json
           [--model M] [--effort E] [--resume SESSION_ID] [--mcp-config FILE] <native_args>

A Session Turn gets the hub's MCP endpoint through `--mcp-config` (see hubmcp.py); a task child does not.

Stdin carries the Agent SDK's stream-json input: an `initialize` control request, the prompt as one
`user` message, then one `control_response` per `can_use_tool` control request. Stdin is closed after
the `result` message, which lets Claude exit.

Stdout → canonical events:
    system/init            → resume handle (`session_id`)
    assistant text blocks  → `text` (top-level turn only; sub-agent text stays on the agent timeline)
    assistant tool_use     → `tool` running; user tool_result → `tool` completed / failed
    tool_use AskUserQuestion (or a can_use_tool request for it) → `question`, then the run fails
    control_request can_use_tool → decided per permission_policy (see approvals.Approvals)
    system/api_retry       → `status` "engine retrying: attempt N of M (cause)"; a credential rejected
                             twice fails the run at once (the CLI would keep retrying)
    result                 → final `usage`, final text, succeeded / failed; after retries the error
                             names the cause ("the model API was unreachable after N attempts; …")

Escalation reply (Claude's control protocol, as the Agent SDK writes it):
    {"type":"control_response","response":{"subtype":"success","request_id":R,
     "response":{"behavior":"allow","updatedInput":{…original input…}}}}
    {"type":"control_response","response":{"subtype":"success","request_id":R,
     "response":{"behavior":"deny","message":"…"}}}
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .approvals import Approvals, Decision
from .base import CliEngine, Emit, EngineResult, Job
from .hubmcp import SERVER, claude_config, private_file, session_endpoint
from .process import ChildProcess, run_child
from .streams import launch_value, mapped_usage, raw_tool, tool_locations, tool_title

QUESTION_TOOL = "AskUserQuestion"
SYNTHETIC = "<synthetic>"  # the model name on messages the CLI writes itself (its API error text)
INIT_REQUEST = {"type": "control_request", "request_id": "amux_init",
                "request": {"subtype": "initialize", "hooks": None}}


class ClaudeEngine(CliEngine):
    """Run Claude Code headless and translate its stream-json."""

    name = "claude"
    config_dirs = (("CLAUDE_CONFIG_DIR", ".claude"),)

    def argv(self, job: Job, mcp_config: Path | None = None) -> list[str]:
        """Build the command line from the frozen snapshot (and the hub's MCP config file for a Session Turn)."""
        snap = job.snapshot
        argv = [self.binary(), "-p", "--output-format", "stream-json", "--verbose", "--input-format", "stream-json"]
        for flag, key in (("--model", "model"), ("--effort", "reasoning_effort"), ("--resume", "resume_handle")):
            value = launch_value(snap, key)
            if value is not None:
                argv += [flag, value]
        if mcp_config is not None:
            argv += ["--mcp-config", str(mcp_config)]
        return argv + [str(a) for a in snap.get("native_args") or []]

    def steering_refusal(self, snapshot: dict[str, Any]) -> str | None:
        """None: stream-json input takes a correction while the turn runs (a `user` line on stdin)."""
        return None

    async def run(self, job: Job, emit: Emit) -> EngineResult:
        """Launch Claude, feed it the prompt and answer its control requests until its result."""
        try:
            self.argv(job)
        except ValueError as e:
            return EngineResult("failed", error=str(e))
        endpoint = session_endpoint(job.env)
        if endpoint is None:  # a task child: the memory CLI, no task MCP tools
            return await self._launch(self.argv(job), job, emit)
        name = f".amux-mcp-{job.task_id}.{job.attempt}.json"
        with private_file(job.env, name, json.dumps(claude_config(endpoint))) as path:
            return await self._launch(self.argv(job, path), job, emit)

    async def _launch(self, argv: list[str], job: Job, emit: Emit) -> EngineResult:
        return await run_child(argv, cwd=job.workspace, env=job.env, stdin=True, name=self.name,
                               boundary=job.boundary, confine=job.confine,
                               consume=lambda child: _ClaudeStream(job, emit, child).consume())


class _ClaudeStream:
    """One run's view of the stream: session id, open tools, text so far."""

    def __init__(self, job: Job, emit: Emit, child: ChildProcess) -> None:
        self.job, self.emit, self.child = job, emit, child
        self.approvals = Approvals(job, emit)
        self.session_id: str | None = job.snapshot.get("resume_handle")
        self.tools: dict[str, tuple[str, str]] = {}
        self.texts: list[str] = []
        self.retry: ApiRetry | None = None  # the last model-API retry the CLI reported
        self.undrained = 0  # corrections written since the last tool-call boundary (see `_steer`)

    async def consume(self) -> EngineResult | None:
        if await self.child.send(INIT_REQUEST) or await self.child.send(_user(self.job.prompt)):
            return None  # it died on launch: reported with its exit code and stderr
        self.job.steer_into = self._steer
        try:
            return await self._read()
        finally:
            self.job.steer_into = None  # after the result stdin closes: nothing more reaches this run

    async def _steer(self, text: str) -> str | None:
        """Write a correction as one more stream-json `user` line while the turn runs.

        Claude Code takes such a line at the turn's next tool-call boundary, into the same turn (one `result`); a
        turn that calls no further tool ends first, and the line then runs as a turn of its own in the same
        process, whose `result` ends the run (`_read`)."""
        failure = await self.child.send(_user(text))
        if failure:
            return f"claude's stdin could not take the correction: {failure}"
        self.undrained += 1
        return None

    async def _read(self) -> EngineResult | None:
        async for msg in self.child.messages():
            kind = msg.get("type")
            if kind == "system" and msg.get("subtype") == "init":
                await self._init(msg)
            elif kind == "system" and msg.get("subtype") == "api_retry":
                ended = await self._retrying(msg)
                if ended:
                    return ended
            elif kind == "assistant":
                ended = await self._assistant(msg)
                if ended:
                    return ended
            elif kind == "user":
                await self._tool_results(msg)
            elif kind == "control_request":
                ended = await self._control(msg)
                if ended:
                    return ended
            elif kind == "result":
                result = await self._result(msg)
                if self.undrained and result.outcome == "succeeded":
                    # A correction came after the last tool call: Claude answers it as a turn of its own next.
                    self.undrained, self.texts = 0, []
                    continue
                return result
        return None

    async def _init(self, msg: dict[str, Any]) -> None:
        if isinstance(msg.get("session_id"), str):
            self.session_id = msg["session_id"]
        if session_endpoint(self.job.env) is None:
            return
        servers = {s.get("name"): s.get("status") for s in msg.get("mcp_servers") or [] if isinstance(s, dict)}
        # "pending": Claude Code is still connecting it in the background and its tools arrive when it has. Any other
        # state (failed, needs-auth, absent) means the agent will not find its task and schedule tools: say so now.
        if servers.get(SERVER) not in ("connected", "pending"):
            await self.emit("warning",
                            {"text": f"the hub's MCP endpoint did not connect ({servers.get(SERVER) or 'absent'}); "
                                                "this turn's agent cannot delegate tasks or create schedules"})

    async def _assistant(self, msg: dict[str, Any]) -> EngineResult | None:
        top_level = msg.get("parent_tool_use_id") is None
        if (msg.get("message") or {}).get("model") != SYNTHETIC:
            self.retry = None  # the model answered: earlier retries are not why a later failure happens
        for block in _blocks(msg):
            if block.get("type") == "text" and top_level and block.get("text"):
                self.texts.append(block["text"])
                await self.emit("text", {"text": block["text"]})
            elif block.get("type") == "text" and block.get("text"):  # a sub-agent's words: the timeline's alone
                await self.emit("agent_text", {"text": block["text"], "parent_tool_use_id": msg["parent_tool_use_id"]})
            elif block.get("type") == "tool_use":
                name, args = str(block.get("name") or ""), block.get("input")
                if name == QUESTION_TOOL:
                    return await self._question(args)
                tool_id = str(block.get("id") or "")
                self.tools[tool_id] = (name, tool_title(name, args))
                await self._tool(tool_id, "running", input=args, locations=tool_locations(args),
                                 diff=_edit_diff(args))
        return None

    async def _tool_results(self, msg: dict[str, Any]) -> None:
        for block in _blocks(msg):
            if block.get("type") == "tool_result":
                tool_id = str(block.get("tool_use_id") or "")
                self.undrained = 0  # a tool-call boundary: Claude takes the lines written since into this turn
                if tool_id in self.tools:
                    await self._tool(tool_id, "failed" if block.get("is_error") else "completed",
                                     output=block.get("content"))

    async def _tool(self, tool_id: str, status: str, **raw: Any) -> None:
        name, title = self.tools[tool_id]
        await self.emit("tool", raw_tool({"id": tool_id, "name": name, "title": title, "status": status}, **raw))

    async def _control(self, msg: dict[str, Any]) -> EngineResult | None:
        request_id, request = str(msg.get("request_id") or ""), msg.get("request") or {}
        if request.get("subtype") != "can_use_tool":
            await self.child.send({"type": "control_response", "response": {
                "subtype": "error", "request_id": request_id,
                "error": f"amux does not serve {request.get('subtype')}"}})
            return None
        tool, args = str(request.get("tool_name") or ""), request.get("input") or {}
        if tool == QUESTION_TOOL:  # a question is never an approval
            return await self._question(args)
        decision = await self.approvals.decide(request_id, tool, tool_title(tool, args), self.child)
        if isinstance(decision, str):
            return self._failed(decision)
        failure = await self.child.send(_control_response(request_id, decision, args))
        if failure:
            return self._failed(f"approval reply could not be delivered: {failure}")
        return None

    async def _question(self, args: Any) -> EngineResult:
        questions = [q for q in (args or {}).get("questions") or [] if isinstance(q, dict)]
        text = "\n".join(str(q.get("question") or q.get("header") or "") for q in questions)
        options = [str(o.get("label")) for q in questions for o in q.get("options") or [] if isinstance(o, dict)]
        await self.emit("question", {"text": text, "options": options})
        return self._failed("claude asked the user a question")

    async def _retrying(self, msg: dict[str, Any]) -> EngineResult | None:
        """Report the CLI's model-API retry as a status event; a credential rejected twice ends the run at once."""
        retry = ApiRetry.of(msg)
        self.retry = retry
        await self.emit("status", retry.event())
        if retry.error == "authentication_failed" and retry.attempt >= 2:
            # The first retry may be a token refresh; a second rejection is the key itself, and the CLI would go on.
            return self._failed(retry.rejected())
        return None

    async def _result(self, msg: dict[str, Any]) -> EngineResult:
        if isinstance(msg.get("session_id"), str):
            self.session_id = msg["session_id"]
        usage = mapped_usage(msg.get("usage"), {})
        if usage:
            await self.emit("usage", {"usage": usage})
        text = msg["result"] if isinstance(msg.get("result"), str) else "\n".join(self.texts)
        if msg.get("subtype") == "success" and not msg.get("is_error"):
            return EngineResult("succeeded", text=text, json=msg.get("structured_output"),
                                resume_handle=self.session_id)
        detail = "; ".join(str(e) for e in msg.get("errors") or []) or text
        if self.retry is not None:  # the model API failed until the CLI gave up retrying
            error = self.retry.gave_up() + (f" (claude: {detail})" if detail else "")
        elif msg.get("subtype") == "success":  # is_error with a success subtype: the CLI's own message says it all
            error = f"claude: {detail}" if detail else "claude ended with an error"
        else:
            error = f"claude ended with {msg.get('subtype') or 'an error'}" + (f": {detail}" if detail else "")
        return EngineResult("failed", text=text, error=error, resume_handle=self.session_id)

    def _failed(self, error: str) -> EngineResult:
        self.child.kill()  # a question or a lost approval ends the run now; the CLI would only wait
        return EngineResult("failed", text="\n".join(self.texts), error=error, resume_handle=self.session_id)


# Claude Code's retry categories (its `api_retry` `error` field) in words, by HTTP status when there is one.
RETRY_CAUSES = {"overloaded": "API overloaded", "rate_limit": "rate limited",
                "authentication_failed": "credential rejected",
                "server_error": "server error"}


@dataclass(frozen=True)
class ApiRetry:
    """One `{"type":"system","subtype":"api_retry",...}` line: the CLI failed a model request and will retry."""

    attempt: int
    max_retries: int
    error: str
    http_status: int | None

    @classmethod
    def of(cls, msg: dict[str, Any]) -> "ApiRetry":
        """Read the line's fields, tolerating missing or mistyped ones."""
        def number(v: Any) -> int:
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0
        status = msg.get("error_status")
        return cls(number(msg.get("attempt")), number(msg.get("max_retries")), str(msg.get("error") or "unknown"),
                   status if isinstance(status, int) and not isinstance(status, bool) else None)

    @property
    def cause(self) -> str:
        """Return the failure in words: no HTTP answer at all is a connection error."""
        if self.http_status is None and self.error == "unknown":
            return "connection error"
        words = RETRY_CAUSES.get(self.error, self.error)
        return f"{words}, HTTP {self.http_status}" if self.http_status is not None else words

    def event(self) -> dict[str, Any]:
        """Return the canonical status event payload."""
        return {"text": f"engine retrying: attempt {self.attempt} of {self.max_retries} ({self.cause})",
                "retry": {"attempt": self.attempt, "max_retries": self.max_retries, "cause": self.cause}}

    def rejected(self) -> str:
        """Return why a run whose credential the model API keeps rejecting fails, naming the fix."""
        status = f" (HTTP {self.http_status})" if self.http_status is not None else ""
        return (f"the model API rejected the credential{status} {self.attempt} times in a row; fix the credential "
                "profile")

    def gave_up(self) -> str:
        """Return why the run failed once the CLI stopped retrying, naming what to check."""
        if self.cause == "connection error":
            return (f"the model API was unreachable after {self.attempt} attempts; "
                    "check the network and the credential profile")
        return f"the model API kept failing ({self.cause}) after {self.attempt} attempts"


def _edit_diff(args: Any) -> dict[str, Any] | None:
    """Return an Edit/MultiEdit call's change as old and new text (the timeline's diff), or None."""
    if not isinstance(args, dict):
        return None
    if isinstance(args.get("old_string"), str) or isinstance(args.get("new_string"), str):
        return {"old": args.get("old_string") or "", "new": args.get("new_string") or ""}
    edits = args.get("edits")
    if isinstance(edits, list):
        return {"edits": [{"old": e.get("old_string") or "", "new": e.get("new_string") or ""}
                          for e in edits if isinstance(e, dict)]}
    return None


def _user(text: str) -> dict[str, Any]:
    """Return one stream-json input `user` message (the prompt, or a correction while the turn runs)."""
    return {"type": "user", "session_id": "", "parent_tool_use_id": None, "message": {"role": "user", "content": text}}


def _blocks(msg: dict[str, Any]) -> list[dict[str, Any]]:
    content = (msg.get("message") or {}).get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _control_response(request_id: str, decision: Decision, args: Any) -> dict[str, Any]:
    if decision.allow:
        answer: dict[str, Any] = {"behavior": "allow", "updatedInput": args}
    else:
        answer = {"behavior": "deny", "message": decision.message or "denied"}
    return {"type": "control_response",
            "response": {"subtype": "success", "request_id": request_id, "response": answer}}
