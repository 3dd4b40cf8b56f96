"""The lease aggregate's store interface (`SqlLeaseStore`): lease tasks, the boxes inside them, and the Boxes page's
sign-in sessions; services/leases holds it through this."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from ..db import Connection
from ..leases import Box, BoxLine, BoxSessionRecord, LeaseGate, LeaseTask, TaskPage


class LeaseStore(Protocol):
    """Lease tasks, the boxes inside them, and the Boxes page's sign-in sessions."""

    async def task(self, conn: Connection, task_id: str, *, lock: bool = False) -> LeaseTask | None:
        """Return a lease task; `lock` holds it until the transaction ends."""

    async def task_with_live_boxes(self, conn: Connection, task_id: str) -> tuple[LeaseGate | None, list[Box]]:
        """Return what the lease gate reads of a task and its live boxes, oldest first, in one query."""

    async def task_with_box(self, conn: Connection, task_id: str,
                            box_id: str) -> tuple[LeaseTask | None, Box | None]:
        """Return a lease task and one of its boxes in any state (None when it has no such box), in one query."""

    async def open_task(self, conn: Connection, *, task_id: str, owner_id: str, name: str, holder_label: str,
                        holder_token_id: str, secret_hash: str, now: datetime) -> LeaseTask:
        """Open a task held by the handle whose secret hashes to `secret_hash`."""

    async def touch(self, conn: Connection, task_id: str, secret_hash: str, now: datetime) -> None:
        """Move the activity clock of an open task still held by the handle hashing to `secret_hash`."""

    async def attach(self, conn: Connection, task_id: str, *, secret_hash: str, holder_label: str,
                     holder_token_id: str, now: datetime) -> LeaseTask:
        """Mint a new secret hash for the task, so the previous handle stops working."""

    async def release(self, conn: Connection, task_id: str, now: datetime) -> LeaseTask:
        """Drop the task's secret hash; a release counts as activity."""

    async def close(self, conn: Connection, task_id: str, now: datetime, reason: str) -> None:
        """Close the task for good and drop its secret hash."""

    async def close_quiet(self, conn: Connection, cutoff: datetime, now: datetime, reason: str, limit: int) -> int:
        """Close up to `limit` open tasks quiet since `cutoff`; return how many closed."""

    async def lock_owner(self, conn: Connection, owner_id: str) -> None:
        """Hold the owner's principal row until the transaction ends."""

    async def count_open_tasks(self, conn: Connection, owner_id: str) -> int:
        """Return how many of an owner's tasks are open."""

    async def count_owner_live_boxes(self, conn: Connection, owner_id: str) -> int:
        """Return how many boxes of an owner's tasks still hold resources."""

    async def open_tasks(self, conn: Connection, owner_id: str) -> list[LeaseTask]:
        """Return an owner's open tasks, most recently active first."""

    async def open_tasks_page(self, conn: Connection, owner_id: str, size: int, *,
                              after: tuple[datetime, str] | None = None,
                              before: tuple[datetime, str] | None = None) -> TaskPage:
        """Return one page of an owner's open tasks with their live boxes and the count of all of them."""

    async def recently_closed(self, conn: Connection, owner_id: str, limit: int) -> list[LeaseTask]:
        """Return an owner's `limit` most recently closed tasks, newest first."""

    async def live_boxes_of_open_tasks(self, conn: Connection, owner_id: str) -> list[BoxLine]:
        """Return the live boxes of an owner's open tasks, oldest first."""

    async def live_box_ids(self, conn: Connection, task_id: str) -> list[str]:
        """Return the ids of a task's live boxes, oldest first."""

    async def count_live_boxes(self, conn: Connection, task_id: str) -> int:
        """Return how many boxes of a task still hold resources."""

    async def add_box(self, conn: Connection, *, box_id: str, task_id: str, name: str | None, driver: str,
                      provisional: dict[str, Any], now: datetime) -> None:
        """Record a box as `creating` with its provisional handle."""

    async def box_made(self, conn: Connection, box_id: str, handle: dict[str, Any]) -> bool:
        """Mark a `creating` box live with the driver's handle; False when it stopped being."""

    async def box_failed(self, conn: Connection, box_id: str, now: datetime) -> None:
        """Mark a box the driver could not make as failed."""

    async def mark_destroyed(self, conn: Connection, box_id: str, now: datetime) -> bool:
        """Mark a box being made or live destroyed; False when it was not."""

    async def box(self, conn: Connection, box_id: str, task_id: str | None = None) -> Box | None:
        """Return a box in any state; with `task_id`, only when it belongs to that task."""

    async def live_boxes_of(self, conn: Connection, task_ids: list[str]) -> list[Box]:
        """Return the boxes of these tasks that still hold resources, oldest first."""

    async def stuck_boxes(self, conn: Connection, cutoff: datetime, limit: int) -> list[Box]:
        """Return up to `limit` boxes left `creating` since `cutoff` or before, oldest first."""

    async def closed_tasks_with_live_boxes(self, conn: Connection, limit: int) -> list[str]:
        """Return up to `limit` closed tasks that still have boxes holding resources."""

    async def open_box_session(self, conn: Connection, *, session_id: str, principal_id: str, token_id: str,
                               session_hash: str, now: datetime, expires_at: datetime) -> None:
        """Store a Boxes page session by the hash of its secret."""

    async def box_session(self, conn: Connection, session_id: str) -> BoxSessionRecord | None:
        """Return a session with its principal's name and its token's label, admin, kind and revocation."""

    async def revoke_box_session(self, conn: Connection, session_id: str, session_hash: str, now: datetime) -> bool:
        """End a session when the secret's hash matches and it is still open; return whether it ended now."""
