"""Answer an engine's approval requests as the task's permission_policy says."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..domain.policy import APPROVAL_REPLIES, DEFAULT_POLICY
from .base import Emit, Job, PermissionReply
from .process import ChildProcess


@dataclass(frozen=True)
class Decision:
    """The answer to one approval request."""

    allow: bool
    message: str = ""


class Approvals:
    """Decide approval requests: allow (policy-allow), deny (deny-all) or ask the main session (escalate-to-main).

    Only escalate-to-main emits a `permission` event and waits for the matching PermissionReply from
    `job.permission_replies`; replies for other requests that arrive first are kept for them.
    """

    def __init__(self, job: Job, emit: Emit) -> None:
        self.policy = job.snapshot.get("permission_policy") or DEFAULT_POLICY
        self.mode = APPROVAL_REPLIES.get(self.policy, "deny")  # an unknown policy fails closed
        self._job = job
        self._emit = emit
        self._early: dict[str, PermissionReply] = {}

    async def decide(self, request_id: str, tool: str, title: str, child: ChildProcess) -> Decision | str:
        """Return the decision, or (a str) why no reply can be delivered because the child is gone."""
        if self.mode == "allow":
            return Decision(True)
        if self.mode == "deny":
            return Decision(False, f"denied by permission_policy {self.policy}")
        await self._emit("permission", {"request_id": request_id, "tool": tool, "title": title})
        reply = await self._wait(request_id, child)
        if reply is None:
            return (f"approval reply could not be delivered: {child.name} exited "
                    f"with code {child.proc.returncode} while waiting for it")
        return Decision(reply.allow, reply.message)

    async def _wait(self, request_id: str, child: ChildProcess) -> PermissionReply | None:
        exited = asyncio.ensure_future(child.proc.wait())
        got: asyncio.Future | None = None
        try:
            while request_id not in self._early:
                got = asyncio.ensure_future(self._job.permission_replies.get())
                done, _ = await asyncio.wait({got, exited}, return_when=asyncio.FIRST_COMPLETED)
                if got not in done:
                    return None
                reply = got.result()
                if isinstance(reply, PermissionReply):
                    self._early[reply.request_id] = reply
            return self._early.pop(request_id)
        finally:
            exited.cancel()
            if got is not None:
                got.cancel()  # a pending get must not swallow a later reply
