"""MCP tools for lease tasks and their boxes (seed names: `rift_task_*`, `rift_vm_*`)."""
from __future__ import annotations

from typing import Callable

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

from ..services.leases.service import LeaseService
from .server import caller_of, guarded

HANDLE_NOTE = ("`task` (required) is the handle task_<id>.<secret> that rift_task_new or rift_task_attach "
               "returned; every call under it counts as activity.")


class LeaseTask(BaseModel):
    """A lease task: who holds it, how lately it was used, and its live boxes."""

    task_id: str
    name: str
    status: str
    holder: str | None = None
    held: bool = False
    last_holder: str | None = None
    attached_at: str | None = None
    last_activity_at: str | None = None
    released_at: str | None = None
    closed_at: str | None = None
    closed_reason: str | None = None
    created_at: str | None = None
    boxes: list[str] = []


class HeldTask(LeaseTask):
    """A task together with the handle that now holds it; pass `handle` as `task` to every other call."""

    handle: str
    previous_holder: str | None = None
    took_over: bool = False
    note: str = ("Keep this handle private to this conversation (sub-agents may share it); "
                 "attaching again mints a new one and this one stops working.")


class LeaseTaskList(BaseModel):
    """The caller's open tasks, then the most recently closed ones."""

    tasks: list[LeaseTask]


class ClosedTask(LeaseTask):
    """A closed task and the boxes its closing destroyed."""

    destroyed: list[str] = []


class Box(BaseModel):
    """A box (seed: VM) claimed inside a task."""

    vm_id: str
    task_id: str
    name: str | None = None
    driver: str
    state: str
    sandbox: str | None = None
    sandboxed: bool = True
    network: str | None = None
    limits: dict[str, str] | None = None
    warning: str | None = None
    created_at: str | None = None
    destroyed_at: str | None = None


class BoxList(BaseModel):
    """The live boxes of a task."""

    task_id: str
    boxes: list[Box]


class ExecResult(BaseModel):
    """What a command did in a box: exit code (null when killed at the timeout) and capped output."""

    vm_id: str
    task_id: str
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    duration_s: float = 0.0
    note: str | None = None


def _exec_note(r: dict) -> str | None:
    notes = []
    if r["timed_out"]:
        notes.append("the command was killed at the timeout; the box is still usable")
    if r["stdout_truncated"] or r["stderr_truncated"]:
        notes.append("output was truncated to the first 64 KiB per stream; redirect to a file and read parts of it")
    return "; ".join(notes) or None


def lease_tools(leases: LeaseService) -> Callable[[MCPServer], None]:
    """Return a registrar adding the rift_task_* and rift_vm_* tools."""

    def register(server: MCPServer) -> None:
        @server.tool()
        async def rift_task_new(name: str, ctx: Context) -> HeldTask:
            """Open a lease task (the unit you claim VMs for) and hold it; returns the handle to pass as `task`."""
            return HeldTask(**await guarded(lambda: leases.new(caller_of(ctx), name)))

        @server.tool()
        async def rift_task_list(ctx: Context) -> LeaseTaskList:
            """List your open tasks (holder, last activity, VMs) and the most recently closed ones."""
            return LeaseTaskList(tasks=[LeaseTask(**t) for t in await guarded(lambda: leases.list(caller_of(ctx)))])

        @server.tool()
        async def rift_task_attach(task_id: str, ctx: Context, takeover: bool = False) -> HeldTask:
            """Take up one of your tasks with a new handle; the previous handle stops working.

            A released task, or one quiet for 30 minutes, is taken without asking; a task active lately
            needs takeover=true — ask the user first, another agent may be using it.
            """
            return HeldTask(**await guarded(lambda: leases.attach(caller_of(ctx), task_id, takeover)))

        @server.tool(description=f"Give up the task's lease so another agent can `rift_task_attach` it. {HANDLE_NOTE}")
        async def rift_task_release(ctx: Context, task: str | None = None) -> LeaseTask:
            """Give up the task's lease."""
            return LeaseTask(**await guarded(lambda: leases.release(caller_of(ctx), task)))

        @server.tool(description=f"Close the task and destroy every VM in it. {HANDLE_NOTE}")
        async def rift_task_close(ctx: Context, task: str | None = None) -> ClosedTask:
            """Close the task and destroy its VMs."""
            return ClosedTask(**await guarded(lambda: leases.close(caller_of(ctx), task)))

        @server.tool(description=f"Claim a new VM (box) inside the task. {HANDLE_NOTE}")
        async def rift_vm_new(ctx: Context, task: str | None = None, name: str | None = None) -> Box:
            """Claim a new VM inside the task."""
            return Box(**await guarded(lambda: leases.vm_new(caller_of(ctx), task, name)))

        @server.tool(description=f"List the task's live VMs. {HANDLE_NOTE}")
        async def rift_vm_list(ctx: Context, task: str | None = None) -> BoxList:
            """List the task's VMs."""
            rows = await guarded(lambda: leases.vm_list(caller_of(ctx), task))
            return BoxList(task_id=str(task).strip().split(".", 1)[0], boxes=[Box(**b) for b in rows])

        @server.tool(description=("Run a shell command in one of the task's VMs; returns the exit code and "
                                  "stdout/stderr capped at 64 KiB each. timeout_s defaults to 60 (at most 900); "
                                  f"a command still running then is killed and the VM stays usable. {HANDLE_NOTE}"))
        async def rift_vm_exec(vm_id: str, command: str, ctx: Context, task: str | None = None,
                               timeout_s: float | None = None) -> ExecResult:
            """Run a shell command in a VM."""
            r = await guarded(lambda: leases.vm_exec(caller_of(ctx), task, vm_id, command, timeout_s))
            return ExecResult(**r, note=_exec_note(r))

        @server.tool(description=f"Destroy one VM of the task: kills its processes and removes it. {HANDLE_NOTE}")
        async def rift_vm_destroy(vm_id: str, ctx: Context, task: str | None = None) -> Box:
            """Destroy one VM."""
            return Box(**await guarded(lambda: leases.vm_destroy(caller_of(ctx), task, vm_id)))

    return register
