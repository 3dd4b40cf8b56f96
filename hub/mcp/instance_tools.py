"""MCP tools for persistent Agent Instances (their answers are the views of hub/services/views.py)."""
from __future__ import annotations

from typing import Callable

from mcp.server.mcpserver import Context, MCPServer

from ..domain.choices import Args
from ..services.sessions.instances import InstanceService
from ..services.views import (FollowupView, InstanceCreatedView, InstanceView, InstanceWaitView, InterruptView,
                              MailView, SteerView)
from .server import caller_of, guarded


def instance_tools(instances: InstanceService) -> Callable[[MCPServer], None]:
    """Return a registrar adding the instance_* tools."""

    def register(server: MCPServer) -> None:
        @server.tool()
        async def instance_create(ctx: Context, name: str | None = None, profile: str | None = None,
                                  model: str | None = None, reasoning_effort: str | None = None,
                                  runtime: str | None = None, permission_policy: str | None = None,
                                  extra_args: Args | None = None, prompt: str | None = None,
                                  timeout_s: float | None = None) -> InstanceCreatedView:
            """Create a persistent agent (ai_…) with a frozen identity and policy; `prompt` starts its first run."""
            return await guarded(lambda: instances.create(
                caller_of(ctx), name=name, profile=profile, model=model, reasoning_effort=reasoning_effort,
                runtime=runtime, permission_policy=permission_policy, extra_args=extra_args, prompt=prompt,
                timeout_s=timeout_s))

        @server.tool()
        async def instance_followup(instance_id: str, prompt: str, ctx: Context, profile: str | None = None,
                                    engine: str | None = None, model: str | None = None, runtime: str | None = None,
                                    permission_policy: str | None = None,
                                    timeout_s: float | None = None) -> FollowupView:
            """Submit work as a new owner TaskRun; omitted identity keeps the saved one, changes are refused."""
            return await guarded(lambda: instances.followup(
                caller_of(ctx), instance_id, prompt, timeout_s=timeout_s, profile=profile, engine=engine, model=model,
                runtime=runtime, permission_policy=permission_policy))

        @server.tool()
        async def instance_send(instance_id: str, text: str, ctx: Context) -> MailView:
            """Queue mailbox input only; it is delivered ahead of the next prompt on a later wake."""
            return await guarded(lambda: instances.send(caller_of(ctx), instance_id, text))

        @server.tool()
        async def instance_steer(instance_id: str, text: str, ctx: Context) -> SteerView:
            """Correct the running turn; answers delivered, queued (fell back to the mailbox) or unknown (not queued).
            """
            return await guarded(lambda: instances.steer(caller_of(ctx), instance_id, text))

        @server.tool()
        async def instance_interrupt(instance_id: str, ctx: Context) -> InterruptView:
            """Cancel every unfinished owner TaskRun (running and queued); the instance stays and can be followed up."""
            return await guarded(lambda: instances.interrupt(caller_of(ctx), instance_id))

        @server.tool()
        async def instance_get(instance_id: str, ctx: Context) -> InstanceView:
            """Return the instance's status, sticky runtime, refs, resume handle and current run."""
            return await guarded(lambda: instances.get(caller_of(ctx), instance_id))

        @server.tool()
        async def instance_wait(instance_id: str, ctx: Context, timeout_s: float = 30) -> InstanceWaitView:
            """Wait for the current run; a timeout never cancels or times out the Task (inspect it with task_get)."""
            return await guarded(lambda: instances.wait(caller_of(ctx), instance_id, timeout_s))

        @server.tool()
        async def instance_archive(instance_id: str, ctx: Context) -> InstanceView:
            """Archive an idle instance (refused while any owner run is unfinished); it takes no more work."""
            return await guarded(lambda: instances.archive(caller_of(ctx), instance_id))

    return register


__all__ = ["instance_tools"]
