"""Codex under escalate-to-main: `codex app-server`, JSON-RPC 2.0 (without the "jsonrpc" member) over stdio.

`codex exec` forces approval_policy=never for its headless run, so no approval request would ever reach
the main session. The app server is what Codex's IDE clients drive; it asks its client for approval, and
amux answers those requests through `approvals.Approvals`, like Claude's `can_use_tool`.

Protocol (codex-rs/app-server-protocol, v2; `codex app-server generate-json-schema` prints it), one JSON
object per line:
    → {"id":1,"method":"initialize","params":{"clientInfo":{"name":"amux","title":"amux hub","version":V}}}
    ← {"id":1,"result":{"userAgent":…,"codexHome":…,"platformFamily":…,"platformOs":…}}
    → {"method":"initialized"}
    → {"id":2,"method":"thread/start","params":{"cwd":WS,"approvalPolicy":P,"sandbox":S,"model":M?}}
      (or "thread/resume" with "threadId": the resume handle)
    ← {"id":2,"result":{"thread":{"id":THREAD,…},…}}
    → {"id":3,"method":"turn/start","params":{"threadId":THREAD,"input":[{"type":"text","text":PROMPT}],"effort":E?}}
    ← {"id":3,"result":{"turn":{"id":TURN,"status":"inProgress",…}}}
    ← notifications: item/started, item/completed {item, threadId, turnId}; thread/tokenUsage/updated
      {threadId, turnId, tokenUsage: {total, last, modelContextWindow}}; error {error: {message,
      additionalDetails, codexErrorInfo}, willRetry, turnId}; turn/completed {turn: {id, status, error}}
    ← server requests (answered with {"id":R,"result":…}):
      item/commandExecution/requestApproval {itemId, command, reason}   → {"decision":"accept"|"decline"}
      item/fileChange/requestApproval {itemId, reason}                   → {"decision":"accept"|"decline"}
      item/permissions/requestApproval {permissions, reason}             → {"permissions":granted,"scope":"turn"}
      mcpServer/elicitation/request {serverName, message}                → {"action":"accept"|"decline"}
      execCommandApproval / applyPatchApproval (v1)                      → {"decision":"approved"|"denied"}
      item/tool/requestUserInput {questions}                             → `question`, then the run fails
      anything else                                                      → a JSON-RPC error: not served

Launch: `codex app-server [-c K=V …] [--enable F …] [--disable F …]`. The policy's `--sandbox` and
`-c approval_policy=` become thread parameters; `--skip-git-repo-check` is exec's alone and is dropped;
other `codex exec` options have no app-server form and fail the run before launch, naming them.
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

from ..clock import within
from ..domain.events import turn_usage
from .approvals import Approvals, Decision
from .base import Emit, EngineResult, Job
from .environment import child_env
from .process import ChildProcess
from .streams import program_name, raw_tool

CLIENT = {"name": "amux", "title": "amux hub", "version": "1"}
PASSTHROUGH = frozenset({"-c", "--config", "--enable", "--disable"})
DROPPED = frozenset({"--skip-git-repo-check"})
USAGE_NAMES = {"inputTokens": "input_tokens", "cachedInputTokens": "cached_input_tokens",
               "outputTokens": "output_tokens", "reasoningOutputTokens": "reasoning_tokens",
               "totalTokens": "total_tokens", "cacheWriteInputTokens": "cache_creation_input_tokens"}
TOOL_ITEMS = {"commandExecution": "command_execution", "fileChange": "file_change", "mcpToolCall": "mcp_tool_call",
              "dynamicToolCall": "dynamic_tool_call", "webSearch": "web_search",
              "collabAgentToolCall": "collab_tool_call"}
STATUSES = {"inProgress": "running", "completed": "completed", "failed": "failed", "declined": "failed",
            "interrupted": "failed"}
QUESTION = "item/tool/requestUserInput"


class LaunchRefused(ValueError):
    """The snapshot cannot be launched as `codex app-server` (the message names the fix)."""


def app_server_launch(native_args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split exec-style native args into app-server argv options and thread parameters (sandbox, approvalPolicy)."""
    argv: list[str] = []
    thread: dict[str, str] = {}
    i = 0
    while i < len(native_args):
        arg = native_args[i]
        name, eq, attached = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        value = attached if eq else (native_args[i + 1] if i + 1 < len(native_args) else "")
        step = 1 if eq else 2
        if name in ("--sandbox", "-s"):
            thread["sandbox"] = value
        elif name in ("-c", "--config") and value.split("=", 1)[0].strip() == "approval_policy":
            thread["approvalPolicy"] = value.split("=", 1)[1].strip().strip("\"'")
        elif name in PASSTHROUGH:
            argv += [name, value]
        elif name in DROPPED:
            step = 1
        else:
            raise LaunchRefused(f"extra_args option {arg!r} is a `codex exec` option that `codex app-server` "
                                "(which runs codex under permission_policy escalate-to-main) does not take; "
                                "remove it, pass settings as `-c key=value`, or use policy-allow")
        i += step
    return argv, thread


async def has_app_server(binary: str, env: Mapping[str, str]) -> bool:
    """Return whether this codex knows `app-server` (older releases answer `unrecognized subcommand`)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            binary, "app-server", "--help", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, env=child_env(env), start_new_session=True)
    except OSError:
        return False
    try:
        return await within(proc.wait(), 20) == 0
    except asyncio.TimeoutError:
        proc.kill()
        return False


class AppServerRun:
    """One run over the app server: handshake, one turn, approvals answered, events mapped."""

    def __init__(self, job: Job, emit: Emit, child: ChildProcess, thread_params: dict[str, Any],
                 retries: Any) -> None:
        self.job, self.emit, self.child = job, emit, child
        self.thread_params = thread_params
        self.retries = retries
        self.approvals = Approvals(job, emit)
        self.thread_id: str | None = job.snapshot.get("resume_handle")
        self.turn_id: str | None = None
        self.text = ""
        self.error: str | None = None
        self.tool_status: dict[str, str] = {}
        self.titles: dict[str, tuple[str, str]] = {}  # item id → (canonical tool name, title), for approvals
        self._next_id = 0
        self._messages = child.messages()
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}  # our requests sent outside `_call` (steers)

    async def consume(self) -> EngineResult | None:
        """Drive the handshake and the turn; return the turn's result (None: the server died without one)."""
        init = await self._call("initialize", {"clientInfo": CLIENT})
        if isinstance(init, EngineResult) or init is None:
            return init
        if await self.child.send({"method": "initialized"}):
            return None
        started = await self._call(*self._thread_request())
        if isinstance(started, EngineResult) or started is None:
            return started
        self.thread_id = str((started.get("thread") or {}).get("id") or self.thread_id or "")
        turn_params: dict[str, Any] = {"threadId": self.thread_id,
                                       "input": [{"type": "text", "text": self.job.prompt, "text_elements": []}]}
        if self.job.snapshot.get("reasoning_effort"):
            turn_params["effort"] = self.job.snapshot["reasoning_effort"]
        turn = await self._call("turn/start", turn_params)
        if isinstance(turn, EngineResult) or turn is None:
            return turn
        self.turn_id = str((turn.get("turn") or {}).get("id") or "") or None
        if self.turn_id:
            self.job.steer_into = self._steer
        try:
            async for msg in self._messages:
                ended = await self._dispatch(msg)
                if ended is not None:
                    return ended
        finally:
            self.job.steer_into = None
        return self._failed(self.error) if self.error else None

    async def _steer(self, text: str) -> str | None:
        """Send `turn/steer` for the running turn (`expectedTurnId`: a turn that ended meanwhile is refused by the
        server); None once the server accepted it, else its refusal."""
        self._next_id += 1
        rid = self._next_id
        answer = asyncio.get_running_loop().create_future()
        self._answers[rid] = answer
        try:
            failure = await self.child.send({"id": rid, "method": "turn/steer", "params": {
                "threadId": self.thread_id, "expectedTurnId": self.turn_id,
                "input": [{"type": "text", "text": text, "text_elements": []}]}})
            if failure:
                return f"codex app-server could not take the correction: {failure}"
            msg = await answer
        finally:
            self._answers.pop(rid, None)
        if "error" in msg:
            err = msg.get("error") or {}
            return f"codex app-server refused turn/steer: {err.get('message') or err}"
        return None

    def _thread_request(self) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {"cwd": str(self.job.workspace), **self.thread_params}
        if self.job.snapshot.get("model"):
            params["model"] = self.job.snapshot["model"]
        if self.thread_id:
            return "thread/resume", {**params, "threadId": self.thread_id}
        return "thread/start", params

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any] | EngineResult | None:
        """Send a request and handle what arrives until its response; return its result (or how the run ended)."""
        self._next_id += 1
        rid = self._next_id
        if await self.child.send({"id": rid, "method": method, "params": params}):
            return None
        async for msg in self._messages:
            if msg.get("id") == rid and "method" not in msg:
                if "error" in msg:
                    err = msg.get("error") or {}
                    return self._failed(f"codex app-server refused {method}: {err.get('message') or err}")
                result = msg.get("result")
                return result if isinstance(result, dict) else {}
            ended = await self._dispatch(msg)
            if ended is not None:
                return ended
        return None

    async def _dispatch(self, msg: dict[str, Any]) -> EngineResult | None:
        method = msg.get("method")
        if not isinstance(method, str):
            msg_id = msg.get("id")
            answer = self._answers.get(msg_id) if isinstance(msg_id, int) else None
            if answer is not None and not answer.done():
                answer.set_result(msg)  # the answer to a steer
            return None  # else a response to nothing we wait for
        raw = msg.get("params")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if "id" in msg:
            return await self._server_request(msg["id"], method, params)
        if params.get("turnId") not in (None, self.turn_id) and method != "thread/tokenUsage/updated":
            return None  # another turn's news (turn_usage makes the same cut for usage)
        if method in ("item/started", "item/completed") and isinstance(params.get("item"), dict):
            await self._item(method, params["item"])
        elif method == "thread/tokenUsage/updated":
            usage = turn_usage(_usage(params.get("tokenUsage")), params.get("turnId"), self.turn_id)
            if usage:
                await self.emit("usage", {"usage": usage})
        elif method == "error":
            return await self._error(params)
        elif method == "turn/completed":
            return self._completed(params.get("turn"))
        return None

    async def _item(self, method: str, item: dict[str, Any]) -> None:
        kind, item_id = item.get("type"), str(item.get("id") or "")
        if kind == "agentMessage" and method == "item/completed" and isinstance(item.get("text"), str):
            self.text = item["text"]
            await self.emit("text", {"text": item["text"]})
        elif kind in TOOL_ITEMS:
            name, title = TOOL_ITEMS[kind], _title(kind, item)
            self.titles[item_id] = (name, title)
            default = "completed" if method == "item/completed" else "running"
            status = STATUSES.get(str(item.get("status")), default)
            if self.tool_status.get(item_id) != status:
                self.tool_status[item_id] = status
                await self.emit("tool", raw_tool({"id": item_id, "name": name, "title": title, "status": status},
                                                 **_raw(item)))

    async def _error(self, params: dict[str, Any]) -> EngineResult | None:
        raw = params.get("error")
        err: dict[str, Any] = raw if isinstance(raw, dict) else {}
        message = str(err.get("message") or "codex error")
        detail = err.get("additionalDetails")
        text = f"{message} ({detail})" if detail else message
        if not params.get("willRetry"):
            self.error = text if message.startswith("Reconnecting") else message
        status, failure = self.retries.read(text)
        if status is not None:
            await self.emit("status", status)
        if failure is not None:
            return self._failed(failure)
        return None

    def _completed(self, turn: Any) -> EngineResult | None:
        turn = turn if isinstance(turn, dict) else {}
        if self.turn_id is not None and turn.get("id") not in (None, self.turn_id):
            return None
        status = turn.get("status")
        if status == "completed":
            return EngineResult("succeeded", text=self.text, resume_handle=self.thread_id)
        err = turn.get("error") if isinstance(turn.get("error"), dict) else {}
        return EngineResult("failed", text=self.text, resume_handle=self.thread_id,
                            error=str(err.get("message") or self.error or f"codex turn {status or 'ended'}"))

    async def _server_request(self, rid: Any, method: str, params: dict[str, Any]) -> EngineResult | None:
        if method == QUESTION:
            return await self._question(params.get("questions"))
        ask = self._approval(method, params)
        if ask is None:
            failure = await self.child.send({"id": rid,
                                             "error": {"code": -32601, "message": f"amux does not serve {method}"}})
            return self._failed(f"codex app-server stopped answering: {failure}") if failure else None
        tool, title, answer = ask
        # JSON-RPC ids restart at 0 with every server: the turn's id makes the request id unique across attempts.
        decision = await self.approvals.decide(f"{self.turn_id or self.thread_id}.{rid}", tool, title, self.child)
        if isinstance(decision, str):
            return self._failed(decision)
        failure = await self.child.send({"id": rid, "result": answer(decision)})
        if failure:
            return self._failed(f"approval reply could not be delivered: {failure}")
        return None

    def _approval(self, method: str, params: dict[str, Any]) -> tuple[str, str, Any] | None:
        """Return (tool, title, how to answer) for an approval request, or None for a request amux does not serve."""
        item = self.titles.get(str(params.get("itemId") or ""))
        if method == "item/commandExecution/requestApproval":
            title = program_name(params.get("command")) or (item[1] if item else "command")
            return "command_execution", title, lambda d: {"decision": "accept" if d.allow else "decline"}
        if method == "item/fileChange/requestApproval":
            title = item[1] if item else (params.get("grantRoot") or "file change")
            return "file_change", str(title), lambda d: {"decision": "accept" if d.allow else "decline"}
        if method == "item/permissions/requestApproval":
            asked = params.get("permissions")
            wanted: dict[str, Any] = asked if isinstance(asked, dict) else {}
            granted = {k: wanted[k] for k in ("fileSystem", "network") if k in wanted}
            return "permissions", "additional permissions", lambda d: {"permissions": granted if d.allow else {},
                                                                       "scope": "turn"}
        if method == "mcpServer/elicitation/request":
            server = str(params.get("serverName") or "mcp")
            return f"mcp:{server}", server, lambda d: ({"action": "accept", "content": {}} if d.allow
                                                       else {"action": "decline"})
        if method == "execCommandApproval":
            return "command_execution", program_name(params.get("command")) or "command", _legacy
        if method == "applyPatchApproval":
            return "file_change", "file change", _legacy
        return None

    async def _question(self, questions: Any) -> EngineResult:
        qs = [q for q in questions or [] if isinstance(q, dict)]
        text = "\n".join(str(q.get("question") or q.get("header") or "") for q in qs)
        options = [str(o.get("label")) for q in qs for o in q.get("options") or [] if isinstance(o, dict)]
        await self.emit("question", {"text": text, "options": options})
        return self._failed("codex asked the user a question")

    def _failed(self, error: str) -> EngineResult:
        self.child.kill()  # a question, a lost approval or a hopeless retry: the server would only wait
        return EngineResult("failed", text=self.text, error=error, resume_handle=self.thread_id)


def _legacy(decision: Decision) -> dict[str, str]:
    return {"decision": "approved" if decision.allow else "denied"}


def _usage(raw: Any) -> dict[str, int]:
    """Map the thread's cumulative token usage (`total`) and its context window to canonical names."""
    if not isinstance(raw, dict) or not isinstance(raw.get("total"), dict):
        return {}
    out = {USAGE_NAMES[k]: v for k, v in raw["total"].items() if k in USAGE_NAMES}
    if raw.get("modelContextWindow") is not None:
        out["context_window"] = raw["modelContextWindow"]
    return out


def _title(kind: str, item: dict[str, Any]) -> str:
    if kind == "commandExecution":
        return program_name(item.get("command")) or "command"
    if kind == "fileChange":
        return ", ".join(str(c.get("path")) for c in item.get("changes") or [] if isinstance(c, dict)) or "file change"
    if kind in ("mcpToolCall",):
        return f"{item.get('server')}.{item.get('tool')}"
    if kind in ("dynamicToolCall", "collabAgentToolCall"):
        return str(item.get("tool") or kind)
    return "web search"


def _raw(item: dict[str, Any]) -> dict[str, Any]:
    """Return an item's raw input, output, diff and locations (the app server names them in camelCase)."""
    changes = [c for c in item.get("changes") or [] if isinstance(c, dict)]
    return {"input": item.get("command") or item.get("arguments") or item.get("query"),
            "output": item.get("aggregatedOutput") or item.get("result") or item.get("error"),
            "diff": [c for c in changes if c.get("diff")] or None,
            "locations": [str(c.get("path")) for c in changes if c.get("path")]}
