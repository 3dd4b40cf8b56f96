"""MCP tools for profiles and tasks."""
from __future__ import annotations

from typing import Any, Callable

from mcp.server.mcpserver import Context, MCPServer

from ..domain.choices import TaskChoices
from ..domain.shapes import Short
from ..services.tasks.profiles import BUILTIN_LISTING, ProfileService
from ..errors import Invalid
from ..services.tasks.service import PermissionService, SubmitRequest, TaskService
from ..services.tasks.timeline import TimelineService
from . import models as m
from .choices import takes
from .server import caller_of, guarded

# The builtins' entries of `profile_list`, built once: builtins are code, not data (nothing changes them while the
# hub runs), and the SDK only reads the models it is handed.
BUILTIN_INFOS: tuple[m.ProfileInfo, ...] = tuple(m.ProfileInfo(**p) for p in BUILTIN_LISTING)


# Long by design: one short closure per MCP tool (its signature is the tool's schema).
def task_tools(tasks: TaskService, profiles: ProfileService, permissions: PermissionService,
               timeline: TimelineService | None = None) -> Callable[[MCPServer], None]:
    """Return a registrar adding profile_list, the task_* tools (task_timeline with a timeline) and
    permission_respond."""

    def register(server: MCPServer) -> None:
        @server.tool()
        async def profile_list() -> m.ProfileList:
            """List the profiles a task can run with (builtin shortcuts: claude, codex, pi, scripted)."""
            return m.ProfileList(profiles=[*BUILTIN_INFOS, *(m.ProfileInfo(**p) for p in await profiles.stored())])

        @server.tool()
        @takes(TaskChoices)
        async def task_submit(prompt: str, ctx: Context, name: Short | None = None, **choices: Any) -> m.Submitted:
            """Admit a task (returns at once with its task_id); follow it with task_wait or task_get."""
            req = SubmitRequest(prompt=prompt, name=name, **choices)
            return m.Submitted(**await guarded(lambda: tasks.submit(caller_of(ctx), req)))

        @server.tool()
        @takes(TaskChoices)
        async def task_run(prompt: str, ctx: Context, name: Short | None = None, **choices: Any) -> m.TaskView:
            """Submit a task and block until it is terminal; returns its result."""
            req = SubmitRequest(prompt=prompt, name=name, **choices)
            return await guarded(lambda: tasks.run(caller_of(ctx), req))

        @server.tool()
        async def task_get(task_id: str, ctx: Context) -> m.TaskView:
            """Return a task's status, outcome, result, usage, changed files and error."""
            return await guarded(lambda: tasks.get(caller_of(ctx), task_id))

        @server.tool()
        async def task_wait(task_id: str, ctx: Context, cursor: int = 0, timeout_s: float = 30) -> m.EventPage:
            """Wait for events after `cursor` (or the end); a timeout returns what there is and never cancels the task.
            """
            return m.EventPage(**await guarded(lambda: tasks.wait(caller_of(ctx), task_id, cursor, timeout_s)))

        @server.tool()
        async def task_events(task_id: str, ctx: Context, cursor: int = 0, limit: int = 500) -> m.EventPage:
            """Return a task's events after `cursor` without waiting."""
            return m.EventPage(**await guarded(lambda: tasks.events(caller_of(ctx), task_id, cursor, limit)))

        if timeline is not None:
            @server.tool()
            async def task_timeline(ctx: Context, task_id: str | None = None, turn_id: str | None = None,
                                    cursor: int = 0, limit: int = 500) -> m.TimelinePage:
                """Return the Agent Timeline of one of your tasks (task_id) or turns (turn_id) after `cursor`: the
                raw agent events (tool input and output, diffs, locations, text), credentials redacted."""
                async def read() -> dict:
                    if (task_id is None) == (turn_id is None):
                        raise Invalid("task_timeline: pass exactly one of task_id (a task, tr_…) or turn_id "
                                      "(a session turn, turn_…)")
                    if task_id is not None:
                        return await timeline.read(caller_of(ctx), "task", task_id, cursor, limit)
                    return await timeline.read(caller_of(ctx), "turn", str(turn_id), cursor, limit)
                return m.TimelinePage(**await guarded(read))

        @server.tool()
        async def task_cancel(task_id: str, ctx: Context) -> m.Cancelled:
            """Cancel a task; a queued task ends at once, a running one through its runner."""
            return m.Cancelled(**await guarded(lambda: tasks.cancel(caller_of(ctx), task_id)))

        @server.tool()
        async def permission_respond(task_id: str, request_id: str, allow: bool, ctx: Context,
                                     message: str = "") -> m.PermissionAnswered:
            """Answer a permission request (a `permission` event) of an escalate-to-main task: allow or deny."""
            return m.PermissionAnswered(**await guarded(
                lambda: permissions.respond(caller_of(ctx), task_id, request_id, allow, message)))

    return register
