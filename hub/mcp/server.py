"""Build the MCPServer with amux's tools; authentication happens at the HTTP door."""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CLIENT_INFO_META_KEY

from ..errors import AmuxError
from ..services.auth import AuthService, Caller

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


def build_mcp(auth: AuthService, registrars: list[Callable[[MCPServer], None]]) -> MCPServer:
    """Create the MCP server: client-name capture plus each feature's tools."""
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
    for register in registrars:
        register(server)
    return server
