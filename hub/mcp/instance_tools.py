"""MCP tools for persistent Agent Instances."""
from __future__ import annotations

from typing import Literal

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field

from ..domain.choices import Args
from ..services.instances import InstanceService
from .server import caller_of, guarded


class InstanceView(BaseModel):
    """An Agent Instance: status active/idle/archived, kept apart from Session state and TaskRun status."""

    model_config = {"extra": "allow"}

    instance_id: str
    status: str
    profile: str
    engine: str
    model: str | None = None
    permission_policy: str | None = None
    runtime: str | None = None
    resume_handle: str | None = None
    current_task_id: str | None = None
    current_task_status: str | None = None
    unfinished_task_ids: list[str] = Field(default_factory=list, description=(
        "every owner TaskRun not yet terminal, oldest first; the instance is active while there is one"))
    mailbox_queued: int = 0


class FollowedUp(BaseModel):
    """A followup admitted as a new owner TaskRun."""

    instance_id: str
    task_id: str
    status: str
    mailbox_delivered: int


class Delivery(BaseModel):
    """What happened to a message or correction."""

    model_config = {"extra": "allow"}

    instance_id: str


class SteerAnswer(BaseModel):
    """Where a correction went: taken by the running turn, queued in the mailbox, or unknown (not queued)."""

    instance_id: str
    delivery: Literal["delivered", "queued", "unknown"] = Field(description=(
        "delivered: the running turn took it; queued: no turn could take it (idle, not started, or the engine "
        "takes no steering), so it goes ahead of the next prompt; unknown: the runner never confirmed — not queued"))
    message_id: str
    note: str
    reason: str | None = Field(default=None, description=(
        "queued: why no turn took it (e.g. the engine's protocol takes no input mid-turn, the turn had ended)"))


def instance_tools(instances: InstanceService):  # noqa: ANN201
    """Return a registrar adding the instance_* tools."""

    def register(server: MCPServer) -> None:
        @server.tool()
        async def instance_create(ctx: Context, name: str | None = None, profile: str | None = None,
                                  model: str | None = None, reasoning_effort: str | None = None,
                                  runtime: str | None = None, permission_policy: str | None = None,
                                  extra_args: Args | None = None, prompt: str | None = None,
                                  timeout_s: float | None = None) -> InstanceView:
            """Create a persistent agent (ai_…) with a frozen identity and policy; `prompt` starts its first run."""
            return InstanceView(**await guarded(lambda: instances.create(
                caller_of(ctx), name=name, profile=profile, model=model, reasoning_effort=reasoning_effort,
                runtime=runtime, permission_policy=permission_policy, extra_args=extra_args, prompt=prompt,
                timeout_s=timeout_s)))

        @server.tool()
        async def instance_followup(instance_id: str, prompt: str, ctx: Context, profile: str | None = None,
                                    engine: str | None = None, model: str | None = None, runtime: str | None = None,
                                    permission_policy: str | None = None, timeout_s: float | None = None) -> FollowedUp:
            """Submit work as a new owner TaskRun; omitted identity keeps the saved one, changes are refused."""
            return FollowedUp(**await guarded(lambda: instances.followup(
                caller_of(ctx), instance_id, prompt, timeout_s=timeout_s, profile=profile, engine=engine, model=model,
                runtime=runtime, permission_policy=permission_policy)))

        @server.tool()
        async def instance_send(instance_id: str, text: str, ctx: Context) -> Delivery:
            """Queue mailbox input only; it is delivered ahead of the next prompt on a later wake."""
            return Delivery(**await guarded(lambda: instances.send(caller_of(ctx), instance_id, text)))

        @server.tool()
        async def instance_steer(instance_id: str, text: str, ctx: Context) -> SteerAnswer:
            """Correct the running turn; answers delivered, queued (fell back to the mailbox) or unknown (not queued).
            """
            return SteerAnswer(**await guarded(lambda: instances.steer(caller_of(ctx), instance_id, text)))

        @server.tool()
        async def instance_interrupt(instance_id: str, ctx: Context) -> Delivery:
            """Cancel every unfinished owner TaskRun (running and queued); the instance stays and can be followed up."""
            return Delivery(**await guarded(lambda: instances.interrupt(caller_of(ctx), instance_id)))

        @server.tool()
        async def instance_get(instance_id: str, ctx: Context) -> InstanceView:
            """Return the instance's status, sticky runtime, refs, resume handle and current run."""
            return InstanceView(**await guarded(lambda: instances.get(caller_of(ctx), instance_id)))

        @server.tool()
        async def instance_wait(instance_id: str, ctx: Context, timeout_s: float = 30) -> InstanceView:
            """Wait for the current run; a timeout never cancels or times out the Task (inspect it with task_get)."""
            return InstanceView(**await guarded(lambda: instances.wait(caller_of(ctx), instance_id, timeout_s)))

        @server.tool()
        async def instance_archive(instance_id: str, ctx: Context) -> InstanceView:
            """Archive an idle instance (refused while any owner run is unfinished); it takes no more work."""
            return InstanceView(**await guarded(lambda: instances.archive(caller_of(ctx), instance_id)))

    return register


__all__ = ["instance_tools"]
