"""Build the MCPServer with amux's tools; authentication happens at the HTTP door."""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CLIENT_INFO_META_KEY

from ..errors import AmuxError
from ..profiles import BUILTINS
from ..services.auth import AuthService, Caller
from ..services.tasks import SubmitRequest, TaskService
from . import models as m

INSTRUCTIONS = (
    "amux hub: delegate bounded coding-agent work as Tasks (task_submit, task_wait, task_get). "
    "Use profile 'scripted' for deterministic demos; its prompt is a script (say/tool/usage/write/sleep/ask/fail)."
)


def caller_of(ctx: Context) -> Caller:
    """Return the Caller the HTTP door authenticated for this request."""
    request = ctx.request_context.request
    state = getattr(request, "scope", {}).get("state") or {}
    caller = state.get("caller")
    if caller is None:
        raise ToolError("not authenticated: send `Authorization: Bearer <token>`; create one with `amux token create --principal NAME`")
    return caller


async def guarded(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Turn our refusals into tool errors the client sees as text."""
    try:
        return await fn()
    except AmuxError as e:
        raise ToolError(e.message) from e


def client_name(method: str, params: Any) -> str | None:
    """Find the client's declared name at `initialize` or in a 2026 request's `_meta`."""
    if not isinstance(params, dict):
        return None
    info = params.get("clientInfo") if method == "initialize" else None
    if info is None:
        meta = params.get("_meta")
        info = meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, dict) else None
    name = info.get("name") if isinstance(info, dict) else None
    return name if isinstance(name, str) else None


def build_mcp(auth: AuthService, tasks: TaskService) -> MCPServer:
    """Create the MCP server and register every tool."""
    server = MCPServer("amux", instructions=INSTRUCTIONS, version="0.1.0")

    async def capture_client(ctx, call_next):  # noqa: ANN001, ANN202
        state = getattr(ctx.request, "scope", {}).get("state") or {}
        caller: Caller | None = state.get("caller")
        if caller is not None and caller.label is None:
            name = client_name(ctx.method, dict(ctx.params) if ctx.params else None)
            if name:
                label = await auth.claim_label(caller, name)
                state["caller"] = Caller(caller.principal_id, caller.principal, caller.token_id, label, caller.admin)
        return await call_next(ctx)

    server.middleware.append(capture_client)

    @server.tool()
    async def profile_list() -> m.ProfileList:
        """List the profiles a task can run with (builtin shortcuts: claude, codex, pi, scripted)."""
        return m.ProfileList(profiles=[m.ProfileInfo(**{k: v for k, v in p.public().items() if k != "preset"})
                                       for p in BUILTINS.values()])

    @server.tool()
    async def task_submit(prompt: str, ctx: Context, profile: str | None = None, runtime: str | None = None,
                          model: str | None = None, extra_args: list[str] | None = None,
                          timeout_s: float | None = None, name: str | None = None) -> m.Submitted:
        """Admit a task (returns at once with its task_id); follow it with task_wait or task_get."""
        req = SubmitRequest(prompt, profile, runtime, model, extra_args, timeout_s, name)
        return m.Submitted(**await guarded(lambda: tasks.submit(caller_of(ctx), req)))

    @server.tool()
    async def task_run(prompt: str, ctx: Context, profile: str | None = None, runtime: str | None = None,
                       model: str | None = None, extra_args: list[str] | None = None,
                       timeout_s: float | None = None, name: str | None = None) -> m.TaskView:
        """Submit a task and block until it is terminal; returns its result."""
        req = SubmitRequest(prompt, profile, runtime, model, extra_args, timeout_s, name)
        return m.TaskView(**await guarded(lambda: tasks.run(caller_of(ctx), req)))

    @server.tool()
    async def task_get(task_id: str, ctx: Context) -> m.TaskView:
        """Return a task's status, outcome, result, usage, changed files and error."""
        return m.TaskView(**await guarded(lambda: tasks.get(caller_of(ctx), task_id)))

    @server.tool()
    async def task_wait(task_id: str, ctx: Context, cursor: int = 0, timeout_s: float = 30) -> m.EventPage:
        """Wait for events after `cursor` (or the end); a timeout returns what there is and never cancels the task."""
        return m.EventPage(**await guarded(lambda: tasks.wait(caller_of(ctx), task_id, cursor, timeout_s)))

    @server.tool()
    async def task_events(task_id: str, ctx: Context, cursor: int = 0, limit: int = 500) -> m.EventPage:
        """Return a task's events after `cursor` without waiting."""
        return m.EventPage(**await guarded(lambda: tasks.events(caller_of(ctx), task_id, cursor, limit)))

    @server.tool()
    async def task_cancel(task_id: str, ctx: Context) -> m.Cancelled:
        """Cancel a task; a queued task ends at once, a running one through its runner."""
        return m.Cancelled(**await guarded(lambda: tasks.cancel(caller_of(ctx), task_id)))

    return server
