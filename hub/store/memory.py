"""Hub memory: text entries by (scope, key), and the scope a session is bound to."""
from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa

from .db import Connection, Database
from .tables import memory, runtimes, sessions, task_runs


class SqlMemoryStore:
    """Memory entries and session memory scopes, in SQL."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def session_scope(self, conn: Connection, session_id: str) -> str | None:
        """Return the scope stored on the session as it is (`pending:…` before its first launch, `none`), or None."""
        return (await conn.execute(sa.select(sessions.c.memory_scope).where(sessions.c.id == session_id))).scalar()

    async def run_has_memory(self, conn: Connection, task_id: str) -> bool:
        """Say whether the runtime holding the run reported the memory capability (`memory_cli`): a run outside
        any session has amux memory only then (no runtime, or none reported: no memory, never a fallback)."""
        caps = (await conn.execute(sa.select(runtimes.c.capabilities)
                                   .select_from(task_runs.join(runtimes, runtimes.c.id == task_runs.c.runtime_id))
                                   .where(task_runs.c.id == task_id))).scalar()
        return bool((caps or {}).get("memory_cli"))

    async def get(self, conn: Connection, scope: str, key: str) -> str | None:
        """Return the value of `key` in `scope`, or None; a key in another scope is never seen."""
        return (await conn.execute(sa.select(memory.c.value).where(
            memory.c.scope == scope, memory.c.key == key))).scalar()

    async def put(self, conn: Connection, scope: str, key: str, value: str, now: datetime) -> None:
        """Create `key` in `scope`, or replace its value; either way it was updated at `now`."""
        done = await conn.execute(memory.update().where(memory.c.scope == scope, memory.c.key == key)
                                  .values(value=value, updated_at=now))
        if done.rowcount == 0:
            await conn.execute(memory.insert().values(scope=scope, key=key, value=value, updated_at=now))

    async def delete(self, conn: Connection, scope: str, key: str) -> bool:
        """Delete `key` from `scope` (and from no other scope); False when it was not there."""
        done = await conn.execute(memory.delete().where(memory.c.scope == scope, memory.c.key == key))
        return done.rowcount > 0

    async def keys(self, conn: Connection, scope: str) -> list[str]:
        """Return the keys of `scope`, in order."""
        rows = await conn.execute(sa.select(memory.c.key).where(memory.c.scope == scope).order_by(memory.c.key))
        return [r.key for r in rows]
