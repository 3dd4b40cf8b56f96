"""Hub memory by scope: the store behind `amux memory`, the CLI task children use."""
from __future__ import annotations

import sqlalchemy as sa

from ..clock import Clock
from ..config import MemorySettings
from ..domain import memory as rules
from ..errors import Conflict, Invalid, NotFound
from ..store.db import Database
from ..store.tables import memory, sessions
from .auth import Caller
from .delegation import SESSION_LABEL

KEY_MAX, VALUE_MAX = 200, 64 * 1024


class MemoryService:
    """Read and write memory in the caller's scope."""

    def __init__(self, db: Database, clock: Clock, settings: MemorySettings) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings

    async def scope(self, conn, caller: Caller) -> str:  # noqa: ANN001
        """A child session's bound scope; otherwise the caller's principal or global scope per isolation."""
        if caller.label and caller.label.startswith(SESSION_LABEL):
            stored = (await conn.execute(sa.select(sessions.c.memory_scope).where(
                sessions.c.id == caller.label[len(SESSION_LABEL):]))).scalar()
            scope = stored[len(rules.PENDING):] if stored and stored.startswith(rules.PENDING) else stored
            if scope in (None, rules.NONE):
                raise Conflict("this conversation has no amux memory: capability discovery failed on its runtime "
                               "(see the task's warning event); there is no global fallback")
            return scope
        return rules.scope_for(caller.principal_id, self.settings.user_isolation)

    @staticmethod
    def _key(key: str) -> str:
        if not isinstance(key, str) or not key.strip() or len(key) > KEY_MAX:
            raise Invalid(f"memory key must be 1–{KEY_MAX} characters")
        return key

    async def get(self, caller: Caller, key: str) -> dict:
        """Return one entry."""
        async with self.db.read() as conn:
            scope = await self.scope(conn, caller)
            value = (await conn.execute(sa.select(memory.c.value).where(
                memory.c.scope == scope, memory.c.key == self._key(key)))).scalar()
        if value is None:
            raise NotFound(f"no memory {key!r} in scope {scope}; `amux memory list` shows the keys")
        return {"scope": scope, "key": key, "value": value}

    async def set(self, caller: Caller, key: str, value: str) -> dict:
        """Create or replace one entry."""
        if not isinstance(value, str) or len(value.encode()) > VALUE_MAX:
            raise Invalid(f"memory value must be text of at most {VALUE_MAX} bytes")
        async with self.db.write() as conn:
            scope = await self.scope(conn, caller)
            where = (memory.c.scope == scope) & (memory.c.key == self._key(key))
            done = await conn.execute(memory.update().where(where).values(value=value, updated_at=self.clock.now()))
            if done.rowcount == 0:
                await conn.execute(memory.insert().values(scope=scope, key=key, value=value, updated_at=self.clock.now()))
        return {"scope": scope, "key": key, "stored": True}

    async def delete(self, caller: Caller, key: str) -> dict:
        """Delete one entry."""
        async with self.db.write() as conn:
            scope = await self.scope(conn, caller)
            await conn.execute(memory.delete().where(memory.c.scope == scope, memory.c.key == self._key(key)))
        return {"scope": scope, "key": key, "deleted": True}

    async def list(self, caller: Caller) -> dict:
        """List the keys of the caller's scope."""
        async with self.db.read() as conn:
            scope = await self.scope(conn, caller)
            keys = [r.key for r in await conn.execute(sa.select(memory.c.key).where(memory.c.scope == scope).order_by(memory.c.key))]
        return {"scope": scope, "keys": keys}
