"""Rows the task and runtime store contract tests start from, written straight into the tables."""
from __future__ import annotations

import asyncio
import itertools
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable

import sqlalchemy as sa

from hub.store.db import Connection, Database
from hub.store.tables import (api_tokens, instances, mailbox, principals, reservations, runtimes, sessions,
                              task_events, task_runs)

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)
CAPS = {"platform": "linux", "engines": ["scripted"], "workspace_root": "/tmp", "workspace_writable": True}
_n = itertools.count(1)


def uid(prefix: str) -> str:
    """Return a unique id that sorts by creation within one test."""
    return f"{prefix}_{next(_n):06d}"


async def principal(conn: Connection, name: str | None = None) -> str:
    """Insert a user principal; return its id."""
    pid = uid("pr")
    await conn.execute(principals.insert().values(id=pid, kind="user", name=name or pid, created_at=T0))
    return pid


async def runtime(conn: Connection, owner: str, *, name: str | None = None, status: str = "online", slots: int = 2,
                  connection_id: str | None = "conn_1", last_seen: datetime = T0,
                  caps: dict[str, Any] | None = None) -> str:
    """Insert a runtime; return its id."""
    rid = uid("rt")
    await conn.execute(runtimes.insert().values(
        id=rid, name=name or rid, principal_id=owner, shared=True, capabilities=caps or CAPS, slots=slots,
        status=status, connection_id=connection_id, registered_at=T0, last_seen_at=last_seen))
    return rid


async def task(conn: Connection, owner: str, *, status: str = "queued", runtime_id: str | None = None,
               attempt: int = 0, created_at: datetime = T0, kind: str = "task", session_id: str | None = None,
               turn_seq: int | None = None, event_seq: int = 0, deadline_at: datetime | None = None,
               snapshot: dict[str, Any] | None = None, **extra: Any) -> str:
    """Insert a run; return its id."""
    tid = uid("tr")
    await conn.execute(task_runs.insert().values(
        id=tid, owner_id=owner, prompt="say hi", snapshot=snapshot or {"engine": "scripted"}, status=status,
        runtime_id=runtime_id, attempt=attempt, event_seq=event_seq, last_rseq=0, created_at=created_at, kind=kind,
        session_id=session_id, turn_seq=turn_seq, deadline_at=deadline_at, **extra))
    return tid


async def reservation(conn: Connection, runtime_id: str, task_id: str, *, state: str = "pending", attempt: int = 1,
                      expires_at: datetime = T0 + timedelta(minutes=1), sent_at: datetime | None = None) -> str:
    """Insert a reservation; return its id."""
    rid = uid("res")
    await conn.execute(reservations.insert().values(
        id=rid, runtime_id=runtime_id, task_id=task_id, attempt=attempt, state=state, created_at=T0,
        expires_at=expires_at, sent_at=sent_at))
    return rid


async def session(conn: Connection, owner: str, **values: Any) -> str:
    """Insert a session; return its id."""
    sid = uid("ses")
    await conn.execute(sessions.insert().values(
        id=sid, owner_id=owner, kind="chat", source="cli", engine="scripted", snapshot={}, turns=0,
        created_at=T0, updated_at=T0, **values))
    return sid


async def steer(conn: Connection, owner: str, task_id: str, *, state: str = "pending") -> str:
    """Insert an instance and one steer message for `task_id` in its mailbox; return the message id."""
    iid = uid("ai")
    await conn.execute(instances.insert().values(id=iid, owner_id=owner, session_id=uid("ses"), snapshot={},
                                                 created_at=T0, updated_at=T0))
    mid = uid("mb")
    await conn.execute(mailbox.insert().values(id=mid, instance_id=iid, text="look left", kind="steer", state=state,
                                               task_id=task_id, created_at=T0))
    return mid


async def token(conn: Connection, owner: str, *, admin: bool = False, revoked: bool = False) -> str:
    """Insert an API token row; return its id."""
    tok = uid("tok")
    await conn.execute(api_tokens.insert().values(id=tok, principal_id=owner, token_hash=tok, admin=admin,
                                                  created_at=T0, revoked_at=T0 if revoked else None))
    return tok


async def event(conn: Connection, task_id: str, seq: int, type_: str, payload: dict[str, Any]) -> None:
    """Insert one task event."""
    await conn.execute(task_events.insert().values(task_id=task_id, seq=seq, type=type_, payload=payload,
                                                   created_at=T0))


async def row(db: Database, table: sa.Table, key: str) -> Any:
    """Read one row of `table` by its `id`."""
    async with db.read() as conn:
        return (await conn.execute(sa.select(table).where(table.c.id == key))).first()


async def waits(aw: Awaitable[Any], seconds: float = 0.3) -> asyncio.Task:
    """Start `aw` and say it is still waiting after `seconds` (a lock held elsewhere); return its task."""
    pending = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({pending}, timeout=seconds)
    assert not done, "expected the second transaction to wait for the first one's lock"
    return pending
