"""Hub memory by scope: the store behind `amux memory`, the CLI task children use."""
from __future__ import annotations

from ...clock import Clock
from ...config import MemorySettings
from ...domain import memory as rules
from ...errors import Conflict, Invalid, NotFound
from ...store.db import Connection, Database
from ...store.memory import SqlMemoryStore
from ...store.ports.sessions import MemoryStore
from ..auth.service import Caller
from ..tasks.delegation import SESSION_LABEL

KEY_MAX, VALUE_MAX = 200, 64 * 1024


class MemoryService:
    """Read and write memory in the caller's scope."""

    def __init__(self, db: Database, clock: Clock, settings: MemorySettings) -> None:
        self.db = db
        self.store: MemoryStore = SqlMemoryStore(db)
        self.clock = clock
        self.settings = settings

    async def scope(self, conn: Connection, caller: Caller) -> str:
        """Return a child session's bound scope; otherwise the caller's principal or global scope per isolation (a run
        outside any session: only when its runtime has the memory capability)."""
        if caller.label and caller.label.startswith(SESSION_LABEL):
            stored = await self.store.session_scope(conn, caller.label[len(SESSION_LABEL):])
            scope = stored[len(rules.PENDING):] if stored and stored.startswith(rules.PENDING) else stored
            if scope in (None, rules.NONE):
                raise Conflict("this conversation has no amux memory: capability discovery failed on its runtime "
                               "(see the task's warning event); there is no global fallback")
            return scope
        if caller.kind == "run" and caller.task_id and not await self.store.run_has_memory(conn, caller.task_id):
            raise Conflict("this run has no amux memory: capability discovery failed on its runtime (see the task's "
                           "warning event); there is no global fallback — run it on a runner with `amux` installed")
        # A run outside any session resolves its scope with its effective principal, the run token's (the owner).
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
            value = await self.store.get(conn, scope, self._key(key))
        if value is None:
            raise NotFound(f"no memory {key!r} in scope {scope}; `amux memory list` shows the keys")
        return {"scope": scope, "key": key, "value": value}

    async def set(self, caller: Caller, key: str, value: str) -> dict:
        """Create or replace one entry."""
        if not isinstance(value, str) or len(value.encode()) > VALUE_MAX:
            raise Invalid(f"memory value must be text of at most {VALUE_MAX} bytes")
        async with self.db.write() as conn:
            scope = await self.scope(conn, caller)
            await self.store.put(conn, scope, self._key(key), value, self.clock.now())
        return {"scope": scope, "key": key, "stored": True}

    async def delete(self, caller: Caller, key: str) -> dict:
        """Delete one entry."""
        async with self.db.write() as conn:
            scope = await self.scope(conn, caller)
            await self.store.delete(conn, scope, self._key(key))
        return {"scope": scope, "key": key, "deleted": True}

    async def list(self, caller: Caller) -> dict:
        """List the keys of the caller's scope."""
        async with self.db.read() as conn:
            scope = await self.scope(conn, caller)
            keys = await self.store.keys(conn, scope)
        return {"scope": scope, "keys": keys}
