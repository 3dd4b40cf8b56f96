"""MCP tools for durable schedules."""
from __future__ import annotations

from typing import Any, Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

from ..domain.choices import ChoiceChanges, ExecutionChoices
from ..domain.pages import MAX_SCHEDULES, page_limit
from ..services.auth.service import Caller
from ..services.tasks.delegation import own_session_id
from ..services.schedules.service import ScheduleService, ScheduleSpec
from ..services.views import ScheduleView
from .choices import takes
from .server import caller_of, guarded


class ScheduleList(BaseModel):
    """Schedules, newest first."""

    schedules: list[ScheduleView]


class ScheduleDeleted(BaseModel):
    """A deleted schedule (admitted Tasks keep running)."""

    schedule_id: str
    deleted: bool


class FiringView(BaseModel):
    """One ledger row: admission is distinct from the reconciled outcome."""

    firing_id: str
    nominal_time: str
    fired_at: str | None = None
    admission: str | None = None
    receipt: str | None = None
    task_id: str | None = None
    turn_id: str | None = None
    outcome: str | None = None
    missed_count: int = 0
    reconciled_at: str | None = None
    legacy: bool = False
    manual: bool = False  # fired by schedule_run_now, not by the rule


class ScheduleHistory(BaseModel):
    """A page of firings, newest first; pass next_cursor for the next page."""

    schedule_id: str
    firings: list[FiringView]
    next_cursor: int | None = None


NO_SESSION_REF = ("a session-prompt schedule needs session_ref: call session_list to find your session's id or "
                  "name (an agent inside a Session may omit it: its amux-session token names its own)")


def session_ref_of(caller: Caller, schedule_type: str, session_ref: str | None) -> str | None:
    """Return the session a session-prompt schedule goes into: the one given, else the caller's own Session."""
    if schedule_type != "session-prompt" or session_ref:
        return session_ref
    own = own_session_id(caller)
    if own is None:
        raise ToolError(NO_SESSION_REF)
    return own


# Long by design: one short closure per MCP tool (its signature is the tool's schema); `register` likewise.
def schedule_tools(service: ScheduleService) -> Callable[[MCPServer], None]:
    """Return a registrar adding the schedule_* tools."""

    def register(server: MCPServer) -> None:
        @server.tool()
        @takes(ExecutionChoices)
        async def schedule_create(prompt: str, rule: str, ctx: Context, name: str | None = None,
                                  timezone: str | None = None, schedule_type: str = "subtask",
                                  session_ref: str | None = None, notify: str | None = None,
                                  overlap: str | None = None, **choices: Any) -> ScheduleView:
            """Create a schedule. rule: cron "*/5 * * * *" or "@hourly|@daily|@weekly|@monthly|@yearly",
            interval "every 30s|5m|2h", one-shot "at 2026-12-01T09:00:00+08:00".

            schedule_type "subtask" (default) submits a child Task at each fire; "session-prompt" submits the prompt
            into session_ref (session_list finds one; omitted: the caller's own Session, for an agent inside one).
            Omitted execution choices are resolved at each fire; escalate-to-main is refused.
            notify: which outcomes reach the Feishu administrator — "failures" (default), "all" or "none".
            overlap (subtask only): a fire while this schedule's previous Task is unfinished — "allow" (default:
            admit anyway), "skip" (admit nothing; history shows skipped:overlap), "replace" (cancel it, then admit).
            """
            caller = caller_of(ctx)
            ref = session_ref_of(caller, schedule_type, session_ref)
            spec = ScheduleSpec(name=name, prompt=prompt, rule=rule, timezone=timezone, schedule_type=schedule_type,
                                session_ref=ref, notify=notify, overlap=overlap, **choices)
            return await guarded(lambda: service.create(caller, spec, source="mcp"))

        @server.tool()
        async def schedule_get(schedule_id: str, ctx: Context) -> ScheduleView:
            """Return a schedule with its saved runtime, model, policy and arguments."""
            return await guarded(lambda: service.get(caller_of(ctx), schedule_id))

        @server.tool()
        async def schedule_list(ctx: Context, limit: int = 100) -> ScheduleList:
            """List your schedules, newest first (`limit` from 1 to 1000)."""
            rows = await guarded(lambda: service.list(caller_of(ctx), page_limit(limit, MAX_SCHEDULES, "schedules")))
            return ScheduleList(schedules=rows)

        @server.tool()
        @takes(ChoiceChanges)
        async def schedule_update(schedule_id: str, ctx: Context, name: str | None = None, prompt: str | None = None,
                                  rule: str | None = None, timezone: str | None = None,
                                  session_ref: str | None = None, notify: str | None = None,
                                  overlap: str | None = None, **choices: Any) -> ScheduleView:
            """Change given fields ("" clears an execution choice back to the default); a new rule restarts from now.

            notify: "failures" | "all" | "none" (which outcomes reach the Feishu administrator).
            overlap: "allow" | "skip" | "replace" (a fire while the previous Task is unfinished; subtask only).
            """
            spec = ScheduleSpec(name=name, prompt=prompt, rule=rule, timezone=timezone, schedule_type=None,
                                session_ref=session_ref, notify=notify, overlap=overlap, **choices)
            return await guarded(lambda: service.update(caller_of(ctx), schedule_id, spec))

        @server.tool()
        async def schedule_pause(schedule_id: str, ctx: Context) -> ScheduleView:
            """Pause future dispatch; an already admitted Task keeps running."""
            return await guarded(lambda: service.pause(caller_of(ctx), schedule_id))

        @server.tool()
        async def schedule_resume(schedule_id: str, ctx: Context) -> ScheduleView:
            """Resume dispatch from the next future fire time."""
            return await guarded(lambda: service.resume(caller_of(ctx), schedule_id))

        @server.tool()
        async def schedule_delete(schedule_id: str, ctx: Context) -> ScheduleDeleted:
            """Delete a schedule; its history stays and admitted Tasks keep running."""
            return ScheduleDeleted(**await guarded(lambda: service.delete(caller_of(ctx), schedule_id)))

        @server.tool()
        async def schedule_run_now(schedule_id: str, ctx: Context) -> FiringView:
            """Fire the schedule once, now: ledgered like any firing (manual), correlated to its Task or Turn, the
            same admission and alert rules; the rule's next fire time does not move (a paused schedule runs too)."""
            return FiringView(**await guarded(lambda: service.run_now(caller_of(ctx), schedule_id)))

        @server.tool()
        async def schedule_history(schedule_id: str, ctx: Context, cursor: int = 0, limit: int = 50) -> ScheduleHistory:
            """Return firings newest first: nominal_time, admission, task_id or turn_id, reconciled outcome."""
            page: dict[str, Any] = await guarded(lambda: service.history(caller_of(ctx), schedule_id, cursor, limit))
            return ScheduleHistory(schedule_id=page["schedule_id"], next_cursor=page["next_cursor"],
                                   firings=[FiringView(**f) for f in page["firings"]])

    return register
