"""Rows the schedule store suites seed directly (the rows other aggregates' services would have written)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from hub.store.db import Connection
from hub.store.tables import (api_tokens, firings, identity_bindings, incidents, legacy_submissions, principals,
                              runtimes, schedules, task_runs)

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)


def at(minutes: float) -> datetime:
    """Return T0 plus `minutes`."""
    return T0 + timedelta(minutes=minutes)


async def principal(conn: Connection, pid: str, name: str | None = None, kind: str = "user") -> str:
    """Insert a principal."""
    await conn.execute(principals.insert().values(id=pid, kind=kind, name=name or pid, created_at=T0))
    return pid


async def token(conn: Connection, pid: str, *, admin: bool = False, revoked: bool = False) -> str:
    """Insert an API token of `pid` (id `tok_<pid>_<admin>_<revoked>`)."""
    tid = f"tok_{pid}_{int(admin)}_{int(revoked)}"
    await conn.execute(api_tokens.insert().values(id=tid, principal_id=pid, token_hash=tid, admin=admin, created_at=T0,
                                                  revoked_at=T0 if revoked else None))
    return tid


async def binding(conn: Connection, bid: str, pid: str, app_id: str, status: str = "active") -> str:
    """Insert an identity binding (open_id `ou_<bid>`)."""
    await conn.execute(identity_bindings.insert().values(id=bid, principal_id=pid, app_id=app_id, open_id=f"ou_{bid}",
                                                         status=status, created_at=T0))
    return bid


async def schedule(conn: Connection, sid: str, creator: str | None, *, created: float = 0, **kw: Any) -> str:
    """Insert a schedule (every 5m, due at T0 + 5 minutes unless `next_fire_at` is given)."""
    values = {"id": sid, "creator_id": creator, "creator_binding_id": None, "app_id": None, "provenance": {},
              "type": "subtask", "name": sid, "prompt": "say hi", "rule": "every 5m", "timezone": "UTC",
              "paused": False, "next_fire_at": at(5), "created_at": at(created), "updated_at": at(created), **kw}
    await conn.execute(schedules.insert().values(**values))
    return sid


async def firing(conn: Connection, fid: str, sid: str, nominal: float, **kw: Any) -> str:
    """Insert a firing at nominal time T0 + `nominal` minutes (fired then; unrecorded unless told)."""
    values = {"id": fid, "schedule_id": sid, "nominal_time": at(nominal), "fired_at": at(nominal), "missed_count": 0,
              "legacy": False, **kw}
    await conn.execute(firings.insert().values(**values))
    return fid


async def task(conn: Connection, tid: str, owner: str, status: str = "queued", **kw: Any) -> str:
    """Insert a Task run."""
    values = {"id": tid, "owner_id": owner, "prompt": "x", "snapshot": {}, "status": status, "attempt": 0,
              "event_seq": 0, "last_rseq": 0, "created_at": T0, **kw}
    await conn.execute(task_runs.insert().values(**values))
    return tid


async def runtime(conn: Connection, rid: str, owner: str, status: str = "online") -> str:
    """Insert a runtime offering the scripted engine."""
    await conn.execute(runtimes.insert().values(id=rid, name=rid, principal_id=owner, shared=False,
                                                capabilities={"engines": ["scripted"]}, slots=1, status=status,
                                                registered_at=T0, last_seen_at=T0))
    return rid


async def incident(conn: Connection, iid: str, sid: str, app_id: str, *, active: bool = True,
                   creator: str | None = None) -> str:
    """Insert an incident (active: it holds the schedule's active key)."""
    await conn.execute(incidents.insert().values(
        id=iid, schedule_id=sid, app_id=app_id, creator_id=creator, kind="failure",
        state="open" if active else "closed", active_key=sid if active else None, failures=1, missed=0, unknowns=0,
        opened_at=T0, updated_at=T0))
    return iid


async def legacy(conn: Connection, lid: str, sid: str, minutes: float, task_id: str | None) -> str:
    """Insert a pre-ledger submission record."""
    await conn.execute(legacy_submissions.insert().values(id=lid, schedule_id=sid, submitted_at=at(minutes),
                                                          task_id=task_id, detail={}))
    return lid


def utc(dt: datetime | None) -> datetime | None:
    """Compare times from either store (SQLite returns them naive)."""
    if dt is None:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt
