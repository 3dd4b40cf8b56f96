"""MCP tools for Sessions: an agent finds its sessions, reads one, and sends a Turn into one of its own."""
from __future__ import annotations

import math
from typing import Callable

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field

from ..domain.pages import MAX_TURNS, page_limit
from ..services.tasks.delegation import own_session_id
from ..services.sessions.service import SessionService
from .models import ChangedFiles, TaskResult
from .server import caller_of, guarded


class SessionSummary(BaseModel):
    """One of your Sessions: engine, current model and effort, sticky runtime, how many runs it holds."""

    session_id: str
    name: str | None = None
    kind: str = Field(description="interactive (CLI, REST, Feishu chat) or child (an Agent Instance's session)")
    source: str
    engine: str
    model: str | None = None
    reasoning_effort: str | None = None
    runtime: str | None = None
    turns: int = 0
    resume_handle: str | None = None
    created_at: str | None = None
    updated_at: str | None = None


class SessionList(BaseModel):
    """Your Sessions, most recently updated first; `current_session_id` is the one your token belongs to."""

    sessions: list[SessionSummary]
    current_session_id: str | None = Field(
        default=None, description="the session of this amux-session:<id> token (an agent inside a Session), else null")


class TurnLine(BaseModel):
    """One run of a Session, newest first."""

    id: str
    seq: int | None = None
    kind: str
    status: str
    result: str | None = None


class SessionView(BaseModel):
    """A Session with its most recent runs."""

    model_config = {"extra": "allow"}

    session_id: str
    name: str | None = None
    kind: str
    engine: str
    model: str | None = None
    reasoning_effort: str | None = None
    runtime: str | None = None
    resume_handle: str | None = None
    turns: list[TurnLine]
    created_at: str | None = None
    updated_at: str | None = None


class TurnSent(BaseModel):
    """A Turn sent into a Session: queued, or (with wait) its status and outcome so far."""

    model_config = {"extra": "allow"}

    session_id: str
    turn_id: str
    status: str
    outcome: str | None = None
    result: TaskResult | None = None
    changed_files: ChangedFiles | None = None
    error: str | None = None


def session_tools(sessions: SessionService) -> Callable[[MCPServer], None]:
    """Return a registrar adding the session_* tools."""

    def register(server: MCPServer) -> None:
        @server.tool()
        async def session_list(ctx: Context, limit: int = 50) -> SessionList:
            """List your Sessions (id, name, engine, model, runtime), most recently updated first (`limit` 1 to 500).

            Use a session_id or name as `session_ref` for session_get, session_send, or a session-prompt schedule.
            """
            caller = caller_of(ctx)
            rows = await guarded(lambda: sessions.list(caller, limit))
            return SessionList(sessions=[SessionSummary(**r) for r in rows], current_session_id=own_session_id(caller))

        @server.tool()
        async def session_get(ctx: Context, session_ref: str | None = None, turns: int = 20) -> SessionView:
            """Return a Session and its recent `turns` (1 to 200); session_ref is an id or name (omitted: your own)."""
            caller = caller_of(ctx)

            async def get() -> dict:
                count = page_limit(turns, MAX_TURNS, "turns", "turns")
                sid = await sessions.readable_id(caller, session_ref or own_session_id(caller))
                return await sessions.show(caller, sid, count)

            return SessionView(**await guarded(get))

        @server.tool()
        async def session_send(text: str, ctx: Context, session_ref: str | None = None, wait: bool = False,
                               timeout_s: float = 30) -> TurnSent:
            """Send text as the next Turn of one of your Sessions (omitted session_ref: your own session).

            Turns of a session run one at a time, in order, as the session's owner; `wait` waits up to timeout_s
            (at most 600) for the outcome and never cancels the Turn. Another user's session is refused.
            """
            caller = caller_of(ctx)
            seconds = max(0.0, min(float(timeout_s), 600.0)) if math.isfinite(timeout_s) else 30.0
            wait_s = seconds if wait else None
            return TurnSent(**await guarded(lambda: sessions.send(caller, session_ref or own_session_id(caller), text,
                                                                  source="mcp", wait_s=wait_s)))

    return register


__all__ = ["session_tools"]
