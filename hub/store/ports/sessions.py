"""The session aggregate's store interfaces: Sessions and their runs (`SqlSessionStore`), Agent Instances with their
mailbox (`SqlInstanceStore`), memory by scope (`SqlMemoryStore`); services/sessions holds them through these."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from ..db import Connection
from ..records import CurrentRun, InstanceRecord, Mail, OwnerRun, SessionLine, SessionRecord, SessionRun, TaskRunRecord
from ..sessions import DelegationParent, NewRun, NewSession


class SessionStore(Protocol):
    """Sessions, the runs queued in them (Turns, and an instance's owner TaskRuns) and their sticky runtime."""

    async def id_by_name(self, conn: Connection, owner_id: str, name: str) -> str | None:
        """Return the id of the owner's session called `name`, or None (a name is the owner's alone)."""

    async def ids_by_ref(self, conn: Connection, owner_id: str, ref: str) -> list[str]:
        """Return the ids of the owner's sessions whose id or name is `ref` (other owners' sessions never match)."""

    async def runtime_id(self, conn: Connection, runtime_name: str) -> str | None:
        """Return the id of the runtime named `runtime_name` a new session sticks to, or None when none has it."""

    async def runtime_name(self, conn: Connection, runtime_id: str | None) -> str | None:
        """Return the name of a session's sticky runtime, or None when it has none (yet) or it is gone."""

    async def create(self, conn: Connection, new: NewSession, now: datetime) -> None:
        """Insert a session with no runs (`turns` 0), created and updated at `now`."""

    async def get(self, conn: Connection, session_id: str, *, lock: bool = False) -> SessionRecord | None:
        """Return the session, or None; with `lock`, hold its row to the transaction's end (writers queue up)."""

    async def owned(self, conn: Connection, owner_id: str, limit: int) -> list[SessionLine]:
        """Return up to `limit` of the owner's sessions (never another owner's), most recently updated first;
        ties in `updated_at` go newest id first, so pages are stable."""

    async def queue_run(self, conn: Connection, session: SessionRecord, run: NewRun, now: datetime) -> int:
        """Queue `run` as the session's next run (seq `turns + 1`) and return the seq; `session` was read with
        `lock` in this transaction, so the seqs of one session never repeat or skip."""

    async def run_status(self, conn: Connection, run_id: str) -> str | None:
        """Return the status of the run `run_id` (a Turn or a TaskRun), or None when there is no such run."""

    async def turn(self, conn: Connection, turn_id: str) -> TaskRunRecord | None:
        """Return the Turn's run, or None: a TaskRun's id names no Turn."""

    async def recent_runs(self, conn: Connection, session_id: str, limit: int) -> list[SessionRun]:
        """Return the session's last `limit` runs, newest seq first."""

    @staticmethod
    async def delegation_parent(conn: Connection, session_id: str, owner_id: str) -> DelegationParent | None:
        """Return the owner's session with its running run of highest seq; None when it is not the owner's."""


class InstanceStore(Protocol):
    """Agent Instances (an owner's persistent agent bound to one child Session) and their mailbox."""

    async def create(self, conn: Connection, *, instance_id: str, owner_id: str, name: str | None, session_id: str,
                     snapshot: dict[str, Any], now: datetime) -> None:
        """Insert an instance bound to its child session and frozen `snapshot`, with no run yet."""

    async def get(self, conn: Connection, instance_id: str) -> InstanceRecord | None:
        """Return the instance, or None, its row held to the transaction's end: writers of one instance queue up."""

    async def ids_of_owner(self, conn: Connection, owner_id: str, *, archived: bool, limit: int) -> list[str]:
        """Return the ids of the owner's instances, newest first (archived ones only when `archived`)."""

    async def set_current_run(self, conn: Connection, instance_id: str, task_id: str, now: datetime) -> None:
        """Make `task_id` the instance's current run (what steer, interrupt, wait and archive act on)."""

    async def archive(self, conn: Connection, instance_id: str, now: datetime) -> None:
        """Mark the instance archived at `now`; it takes no more work."""

    async def current_run(self, conn: Connection, task_id: str | None) -> CurrentRun | None:
        """Return the status and runtime of the instance's current run `task_id`, or None when it has none."""

    async def unfinished_runs(self, conn: Connection, instance_id: str) -> list[OwnerRun]:
        """Return every owner TaskRun of the instance not yet terminal, oldest first (not only the current one)."""

    async def queued_mail(self, conn: Connection, instance_id: str) -> list[Mail]:
        """Return the instance's queued mailbox input, oldest first: the order it goes ahead of the next prompt."""

    async def count_queued(self, conn: Connection, instance_id: str) -> int:
        """Count the instance's queued mailbox input (not yet delivered to any run)."""

    async def deliver(self, conn: Connection, message_ids: Sequence[str], task_id: str, now: datetime) -> None:
        """Mark the messages delivered into the run `task_id` (they were prepended to its prompt)."""

    async def add_mail(self, conn: Connection, *, message_id: str, instance_id: str, text: str, kind: str,
                       state: str, now: datetime, task_id: str | None = None) -> None:
        """Insert a mailbox message; `state` queued waits for the next run, pending is offered to the running `task_id`.
        """

    async def mail_state(self, conn: Connection, message_id: str) -> str | None:
        """Return the message's state (queued, pending, delivered, unknown), or None when there is no such one."""

    async def mail_note(self, conn: Connection, message_id: str) -> str | None:
        """Return why a steer was queued rather than delivered (the runner's reason), or None."""

    async def give_up_steer(self, conn: Connection, message_id: str, now: datetime) -> bool:
        """Mark a steer that is still pending as unknown (never queued); False when its runner settled it first."""


class MemoryStore(Protocol):
    """Memory entries by (scope, key) and the scope a session is bound to."""

    async def session_scope(self, conn: Connection, session_id: str) -> str | None:
        """Return the scope stored on the session as it is, or None."""

    async def run_has_memory(self, conn: Connection, task_id: str) -> bool:
        """Say whether the runtime holding the run reported the memory capability."""

    async def get(self, conn: Connection, scope: str, key: str) -> str | None:
        """Return the value of `key` in `scope`, or None."""

    async def put(self, conn: Connection, scope: str, key: str, value: str, now: datetime) -> None:
        """Create `key` in `scope`, or replace its value."""

    async def delete(self, conn: Connection, scope: str, key: str) -> bool:
        """Delete `key` from `scope`; False when it was not there."""

    async def keys(self, conn: Connection, scope: str) -> list[str]:
        """Return the keys of `scope`, in order."""
